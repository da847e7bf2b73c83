package router_test

import (
	"slices"
	"testing"
	"time"
)

// BenchmarkConsumerTracing measures the cost of tracing on the consumer
// alone, at the topic default of 48 partitions: b.N pairs of sides, tracing
// off and on (as in BenchmarkConsumer), each side on a database and topic of
// its own with the same workload, the order alternating from pair to pair.
// On a shared machine one pair moves by tens of percent either way, so run
// it with -benchtime 6x or more. It reports the events/s of each side over
// every pair and their ratio, the median of the pairs' ratios, and the CPU
// time per event of the process and of PostgreSQL on each side, which move
// less than the rates, and the mean events of each side's group-commit
// transactions: fewer a transaction cost PostgreSQL more an event
// (docs/benchmarks.md).
func BenchmarkConsumerTracing(b *testing.B) {
	withoutSpanRecording(b)
	const partitions = 48
	var off, on throughput
	var offCPU, onCPU cpuPerEvent
	var offTx, onTx transactions
	var ratios []float64
	for i := range b.N {
		var pairOff, pairOn throughput
		tracingSides(b, i, func() struct{} {
			kc := newConsumerBench(b, partitions)
			tp, cpu, txs := &pairOff, &offCPU, &offTx
			if tracingIsOn() {
				traceWrites(each(kc.msgs)...)
				tp, cpu, txs = &pairOn, &onCPU, &onTx
			}
			sizes, _ := kc.consume(b, partitions, tp, cpu)
			txs.addSizes(sizes)
			return struct{}{}
		})
		ratios = append(ratios, pairOn.rate()/pairOff.rate())
		off.add(pairOff.events, pairOff.secs)
		on.add(pairOn.events, pairOn.secs)
	}
	b.ReportMetric(off.rate(), "off-events/s")
	b.ReportMetric(on.rate(), "on-events/s")
	b.ReportMetric(on.rate()/off.rate(), "tracing-on/off")
	b.ReportMetric(median(ratios), "median-pair-on/off")
	perEvent := func(d time.Duration, events int) float64 { return float64(d.Microseconds()) / float64(events) }
	b.ReportMetric(perEvent(offCPU.consumer, offCPU.events), "off-consumer-cpu-us/event")
	b.ReportMetric(perEvent(onCPU.consumer, onCPU.events), "on-consumer-cpu-us/event")
	if offCPU.postgresMeasured {
		b.ReportMetric(perEvent(offCPU.postgres, offCPU.events), "off-postgres-cpu-us/event")
		b.ReportMetric(perEvent(onCPU.postgres, onCPU.events), "on-postgres-cpu-us/event")
	}
	b.ReportMetric(offTx.perTx(), "off-events/tx")
	b.ReportMetric(onTx.perTx(), "on-events/tx")
	b.Logf("each pair's tracing-on/off, in order: %.3f", ratios)
}

// median is the middle of values (the mean of the two middle ones when
// their number is even); values is not changed.
func median(values []float64) float64 {
	s := slices.Sorted(slices.Values(values))
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
