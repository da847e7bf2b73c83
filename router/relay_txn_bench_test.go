package router_test

import (
	"context"
	"fmt"
	"runtime/pprof"
	"testing"

	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/router"
)

// BenchmarkRelayTransactions measures the relay with a transactional producer
// (RelayTransactionalID, as a process runs it by default) against an
// idempotent one without transactions, in the same run: each of the b.N
// rounds is a pair of the two, in alternating order, on outboxes written as
// the expirer (200 events a transaction) and the purchase API (1) write them.
// It reports events/s of both, the whole run's ratio on/off and the median
// of the pairs' (one pair moves by tens of percent on a shared machine: run
// it with -benchtime 6x or more). 20,000 events a side, 2,000 under -short,
// or PROMOFLOW_RELAY_EVENTS.
func BenchmarkRelayTransactions(b *testing.B) {
	withoutSpanRecording(b)
	n := benchEvents(b, "PROMOFLOW_RELAY_EVENTS", 20_000, 2_000)
	for _, perTx := range []int{expire.BatchSizeDefault, 1} {
		b.Run(fmt.Sprintf("events-per-tx=%d", perTx), func(b *testing.B) {
			var offSecs, onSecs float64
			var ratios []float64
			for i := range b.N {
				var off, on relayRun
				inTurn(i, func() {
					pprof.Do(b.Context(), pprof.Labels("transactions", "off"), func(context.Context) {
						off = relayWith(b, n, perTx, 1, func(string) router.PromotionConfig {
							return router.PromotionConfig{RelayTransactionalID: router.RelayTransactionsOff}
						})
					})
				}, func() {
					pprof.Do(b.Context(), pprof.Labels("transactions", "on"), func(context.Context) {
						on = relayWith(b, n, perTx, 1, func(topic string) router.PromotionConfig {
							return router.PromotionConfig{RelayTransactionalID: router.RelayTransactionalIDFor(topic)}
						})
					})
				})
				offSecs += off.secs
				onSecs += on.secs
				ratios = append(ratios, off.secs/on.secs)
			}
			offRate := float64(n*b.N) / offSecs
			onRate := float64(n*b.N) / onSecs
			b.ReportMetric(offRate, "txn-off-events/s")
			b.ReportMetric(onRate, "txn-on-events/s")
			b.ReportMetric(onRate/offRate, "txn-on/off")
			b.ReportMetric(median(ratios), "median-pair-on/off")
			b.Logf("each pair's on/off, in order: %.3f", ratios)
		})
	}
}
