package router_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
)

// poisonEvery is one invalid record among this many: 1 %.
const poisonEvery = 100

// BenchmarkConsumerPoison measures what invalid records cost the valid
// ones: the consumer's valid events/s with 1 % invalid records (malformed
// JSON, invalid UTF-8, JSON nested 10,000 deep, no targets, a version 0,
// each dead-lettered) among the events of BenchmarkConsumer, against none,
// on 6 partitions, the order of the two sides alternating between runs.
// It reports both rates, their ratio (the goal is 0.9 or more), the time
// from the start of the publish until every invalid record was
// dead-lettered, and the peak RSS of this process with the poisoned
// consumer (the goal is 100 MB or less).
// Wide events are left out (BenchmarkConsumer's workloads and
// TestCatalog_WideEventsAtOnceAllApply measure them).
func BenchmarkConsumerPoison(b *testing.B) {
	withoutSpanRecording(b)
	const partitions = 6
	var clean, poisoned throughput
	var peakMB, toDLQ float64
	for i := range b.N {
		for _, poison := range []bool{i%2 == 1, i%2 == 0} {
			cb := newConsumerBench(b, partitions)
			if !poison {
				var cpu cpuPerEvent
				cb.consume(b, partitions, &clean, &cpu)
				continue
			}
			invalid := cb.poison(b)
			var cpu cpuPerEvent
			var start time.Time
			cb.done = func() bool {
				if testutil.ToFloat64(cb.c.Metrics.DLQ) < float64(invalid) {
					return false
				}
				toDLQ = max(toDLQ, time.Since(start).Seconds())
				return true
			}
			start = time.Now()
			_, mb := cb.consume(b, partitions, &poisoned, &cpu)
			peakMB = max(peakMB, mb)
			b.Logf("%d invalid records among %d, every one dead-lettered %.1fs after the publish began", invalid, len(cb.msgs), toDLQ)
		}
	}
	b.ReportMetric(clean.rate(), "clean-events/s")
	b.ReportMetric(poisoned.rate(), "poisoned-valid-events/s")
	b.ReportMetric(poisoned.rate()/clean.rate(), "poisoned/clean")
	b.ReportMetric(peakMB, "poisoned-peak-rss-MB")
	b.ReportMetric(toDLQ, "all-dead-lettered-s")
}

// poison puts an invalid record after every poisonEvery-1 valid ones in
// the bench's messages, cycling through the kinds, and returns how many.
func (cb *consumerBench) poison(b *testing.B) int {
	kinds := []func(id string) []byte{
		func(id string) []byte { return []byte(`{"PurchaseId":"` + id + `",`) },
		func(id string) []byte { return []byte("{\"PurchaseId\":\"" + id + "\",\"PackageKind\":\"\xff\xfe\"}") },
		func(string) []byte {
			return []byte(strings.Repeat(`{"a":`, 10_000) + "1" + strings.Repeat("}", 10_000))
		},
		func(id string) []byte {
			return []byte(`{"PurchaseId":"` + id + `","TenantId":"` + uuid.NewString() + `","PackageKind":"Top","Targets":[],` +
				`"BoostWeight":5,"Status":"Active","PaymentStatus":"NotRequired","StartsAt":"2026-01-01T00:00:00Z",` +
				`"EndsAt":"2027-01-01T00:00:00Z","Version":1}`)
		},
		func(id string) []byte { return []byte(`{"PurchaseId":"` + id + `","Version":0}`) },
	}
	var out []*message.Message
	n := 0
	for i, msg := range cb.msgs {
		out = append(out, msg)
		if (i+1)%(poisonEvery-1) == 0 {
			id := uuid.NewString()
			bad := message.NewMessage(uuid.NewString(), kinds[n%len(kinds)](id))
			bad.Metadata.Set(event.HeaderAggregateID, id)
			bad.Metadata.Set(event.HeaderContractVersion, event.ContractVersion)
			out = append(out, bad)
			n++
		}
	}
	require.Positive(b, n, fmt.Sprintf("no invalid record among %d", len(cb.msgs)))
	cb.msgs = out
	return n
}
