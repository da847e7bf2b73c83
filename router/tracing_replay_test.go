package router_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/dlqreplay"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestTracing_ReplayKeepsTheOriginalTrace: a record that breaks the contract
// is dead-lettered in its writer's trace (receive → dead-letter), the dead
// letter keeps the record's traceparent, and its replay shows up in that
// same trace: the replay's publish span (linked to the replay run's) and
// the consumer's receive of the replayed record are children of the
// original creation context.
func TestTracing_ReplayKeepsTheOriginalTrace(t *testing.T) {
	c := setupCatalog(t, true)
	c.Start(t)
	ctx, origin := originSpan("test.purchase.create")
	id := uuid.NewString()
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"PurchaseId":"`+id+`","Version":0}`))
	msg.Metadata.Set(event.HeaderContractVersion, event.ContractVersion)
	msg.Metadata.Set(event.HeaderAggregateID, id)
	msg.Metadata.Set(event.HeaderCorrelationID, "replay-"+id)
	event.InjectTrace(ctx, msg)
	require.NoError(t, c.Pub.Publish(c.Cfg.Topic, msg))

	dlq := kafkatest.ReadTopic(t, c.Cfg.DLQTopic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 1 })
	require.Equal(t, traceparent(origin), kafkatest.Header(dlq[0], "traceparent"), "the dead letter keeps the original context")
	first := waitSpan(t, "catalog.promotion.receive", "messaging.destination.name", c.Cfg.Topic)
	require.True(t, childOf(first, origin), "the first receive continues the writer's trace")
	deadLetter := waitSpan(t, "catalog.promotion.dead-letter", "messaging.message.id", msg.UUID)
	require.True(t, childOf(deadLetter, first.SpanContext()), "the dead-letter publish is a child of the receive")
	require.Equal(t, c.Cfg.DLQTopic, attr(deadLetter, "messaging.destination.name"))

	r, err := dlqreplay.New(dlqreplay.Config{Kafka: c.Cfg.Kafka, DB: c.DB, DLQTopic: c.Cfg.DLQTopic, ReplayTopic: c.Cfg.ReplayTopic,
		SourceTopic: c.Cfg.Topic, Group: "pf-test-replay-" + kafkatest.RandomSuffix(), Log: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	runCtx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res, err := r.Run(runCtx)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Replayed)

	replay := waitSpan(t, "catalog.promotion.replay", "messaging.message.id", msg.UUID)
	require.True(t, childOf(replay, origin), "the replay's publish is in the original trace")
	require.Equal(t, c.Cfg.ReplayTopic, attr(replay, "messaging.destination.name"))
	run := findSpan("catalog.promotion.dlq-replay", func(s sdktrace.ReadOnlySpan) bool {
		return len(replay.Links()) == 1 && s.SpanContext().SpanID() == replay.Links()[0].SpanContext.SpanID()
	})
	require.NotNil(t, run, "the replay's publish links to the run's span")
	require.Equal(t, "1", attr(run, "replayed_count"))
	again := waitSpan(t, "catalog.promotion.receive", "messaging.destination.name", c.Cfg.ReplayTopic)
	require.True(t, childOf(again, origin), "the receive of the replayed record continues the original trace")
}
