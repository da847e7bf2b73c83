package router_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestTracing_ExpiryIsOneTrace: a cycle that expires three purchases in one
// batch is one trace: cycle → batch → the publish of its events, and, from
// the batch's context in the Kafka headers, each event's receive → process →
// store, whose transaction continues or links to it.
func TestTracing_ExpiryIsOneTrace(t *testing.T) {
	c := setupCatalog(t, true)
	b := promotionBundle{db: pgtest.DB(t), topic: c.Cfg.Topic}
	due := purchasetest.SeedActive(t, b.db, 3, time.Now().Add(-time.Minute))
	c.Start(t)
	b.start(t, time.Hour)

	var batch sdktrace.ReadOnlySpan
	for _, id := range due {
		receive := waitSpan(t, "catalog.promotion.receive", "purchase.id", id.String())
		if batch == nil {
			batch = findSpan("promotion.expire.batch", func(s sdktrace.ReadOnlySpan) bool {
				return s.SpanContext().SpanID() == receive.Parent().SpanID()
			})
			require.NotNil(t, batch, "the receive span of %s continues the expirer batch's span", id)
		}
		require.True(t, childOf(receive, batch.SpanContext()), "purchase %s: receive is a child of the batch that expired it", id)
		requireConsumed(t, receive)
	}
	runID := attr(batch, "correlation_id")
	require.NotEmpty(t, runID)
	require.Equal(t, "3", attr(batch, "expired_count"))

	cycle := findSpan("promotion.expire.cycle", func(s sdktrace.ReadOnlySpan) bool {
		return s.SpanContext().SpanID() == batch.Parent().SpanID()
	})
	require.NotNil(t, cycle, "the batch is a child of the cycle")
	require.Equal(t, runID, attr(cycle, "correlation_id"), "the cycle's span carries the run id")
	require.False(t, cycle.Parent().IsValid(), "the cycle is the trace's root")

	publish := findSpan("promotion.outbox.publish", func(s sdktrace.ReadOnlySpan) bool { return childOf(s, batch.SpanContext()) })
	require.NotNil(t, publish, "the relay's publish is a child of the batch")
	require.Equal(t, trace.SpanKindProducer, publish.SpanKind())
	require.Equal(t, runID, attr(publish, "correlation_id"), "the publish carries the run id")
	require.Equal(t, "3", attr(publish, "messaging.batch.message_count"))
	require.Equal(t, "kafka", attr(publish, "messaging.system"))
	require.Equal(t, c.Cfg.Topic, attr(publish, "messaging.destination.name"))
}
