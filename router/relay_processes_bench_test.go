package router_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/router"
)

// BenchmarkRelayProcesses measures the outbox relay of one promotion process
// against two on the same outbox, in the same run: n events in the outbox,
// written as the expirer (200 a transaction) or the purchase API (1) writes
// them, then one or two routers built as processes build them
// (router.NewPromotion, each with its own pool and producer, expirers idle),
// until every event is on Kafka. Each iteration runs one, two, two, one, so
// that neither side always goes first. The relay position is one row lock,
// so two processes relay in turns, not side by side: the ratio says what a
// second process adds, and top-share how much of the outbox the busier of
// the two relayed (the least over the runs of two: 1 says one process
// relayed every event of each). It logs the load average at the end.
func BenchmarkRelayProcesses(b *testing.B) {
	withoutSpanRecording(b)
	// The short form keeps to the API's transactions, the relay's slower case.
	perTxs := []int{expire.BatchSizeDefault, 1}
	if testing.Short() {
		perTxs = perTxs[1:]
	}
	for _, perTx := range perTxs {
		b.Run(fmt.Sprintf("events-per-tx=%d", perTx), func(b *testing.B) {
			// Five of the relay's pages at least, so that two processes can
			// take turns at the position.
			n := benchSize(max(20_000, 5*router.OutboxBatchSizeDefault*perTx), 1_000)
			var secs [3]float64 // by processes
			topShare := 1.0
			for range b.N {
				for _, processes := range []int{1, 2, 2, 1} {
					run := relay(b, n, perTx, processes)
					secs[processes] += run.secs
					if processes == 2 {
						topShare = min(topShare, slices.Max(run.relayed)/float64(n))
					}
				}
			}
			// Each side ran twice per iteration.
			one := float64(2*n*b.N) / secs[1]
			two := float64(2*n*b.N) / secs[2]
			b.ReportMetric(one, "processes=1-events/s")
			b.ReportMetric(two, "processes=2-events/s")
			b.ReportMetric(two/one, "ratio")
			b.ReportMetric(topShare, "top-share")
			b.Log(loadAverage())
		})
	}
}
