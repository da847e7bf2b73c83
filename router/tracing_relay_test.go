package router_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestTracing_MergedPublishLinksEveryOrigin: five one-event outbox rows of
// five API transactions (five traces), which the relay merges into one Kafka
// request, get one publish span that links to the span of each transaction
// (messaging conventions, batch publishing); each record keeps its own
// transaction's traceparent, so that its consumer continues its own trace.
func TestTracing_MergedPublishLinksEveryOrigin(t *testing.T) {
	b := setupPromotion(t, 3)
	// An outbox writer held open keeps the rows from the relay until its
	// commit makes them visible at once, in one page and one merged message.
	gate, err := outbox.BeginTx(t.Context(), b.db, nil)
	require.NoError(t, err)
	gate.MustExec(`SELECT pg_current_xact_id()`)
	const n = 5
	origins := map[string]trace.SpanContext{} // by MessageId
	var txs [][]*message.Message
	for i := range n {
		ctx, origin := originSpan("test.purchase.create")
		msg := versionMessage(t, uuid.New(), 1, fmt.Sprintf("merged-%d", i))
		event.InjectTrace(ctx, msg)
		origins[msg.UUID] = origin
		txs = append(txs, []*message.Message{msg})
	}
	writeOutbox(t, b, txs...)
	b.start(t, time.Hour)
	require.NoError(t, gate.Commit())

	records := kafkatest.ReadTopic(t, b.topic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= n })
	require.Len(t, records, n)
	for _, r := range records {
		origin := origins[kafkatest.Header(r, kafka.UUIDHeaderKey)]
		require.True(t, origin.IsValid(), "record of an event the test wrote")
		require.Equal(t, traceparent(origin), kafkatest.Header(r, "traceparent"), "the record carries its own transaction's context")
	}

	var publish sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, origin := range origins {
			publish = findSpan("promotion.outbox.publish", func(s sdktrace.ReadOnlySpan) bool { return linksTo(s, origin) })
			return publish != nil
		}
		return false
	}, 30*time.Second, 10*time.Millisecond, "no publish span links to the first transaction")
	require.Equal(t, fmt.Sprint(n), attr(publish, "messaging.batch.message_count"), "one Kafka request for the merged rows")
	for id, origin := range origins {
		require.True(t, linksTo(publish, origin), "the publish links to the transaction of event %s", id)
		require.NotEqual(t, origin.TraceID(), publish.SpanContext().TraceID(), "a publish of several origins is a trace of its own")
	}
	require.False(t, publish.Parent().IsValid(), "a publish of several origins is a root")
	require.Empty(t, attr(publish, "correlation_id"), "the events have different correlation ids")
}

// traceparent is the W3C traceparent header of sc.
func traceparent(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}
