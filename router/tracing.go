package router

import (
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// tracingPublisher opens one publish span per Kafka request of the relay,
// which carries the events of one outbox row or of several merged ones
// (messaging semantic conventions, batch publishing): the child of the
// events' origin, the writer's transaction, when they share one, and
// otherwise a span of its own linked to every origin. The records keep the
// trace headers of their events, so that each consumer continues its own
// change's trace.
type tracingPublisher struct{ message.Publisher }

func (p tracingPublisher) Publish(topic string, msgs ...*message.Message) error {
	origins := event.Origins(msgs)
	attrs := []attribute.KeyValue{semconv.MessagingSystemKafka, semconv.MessagingDestinationName(topic),
		semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("publish"), semconv.MessagingBatchMessageCount(len(msgs))}
	if c, ok := sharedCorrelationID(msgs); ok {
		// The seed: the cycle's run id is on the publish of its events.
		attrs = append(attrs, attribute.String("correlation_id", c))
	}
	if len(msgs) == 1 {
		attrs = append(attrs, semconv.MessagingMessageID(msgs[0].UUID),
			semconv.MessagingKafkaMessageKey(msgs[0].Metadata.Get(event.HeaderAggregateID)))
	}
	_, span := middleware.StartBatchSpan("promotion.outbox.publish", trace.SpanKindProducer, origins, attrs...)
	defer span.End()
	err := p.Publisher.Publish(topic, msgs...)
	if be := (*kafkakit.BatchError)(nil); errors.As(err, &be) {
		// Which records Kafka refused: the relay resends those (Resender).
		span.SetAttributes(attribute.Int("messaging.batch.failed_count", len(be.Failed)))
		for _, msg := range msgs {
			if failed := be.Failed[msg.UUID]; failed != nil {
				span.AddEvent("message refused", trace.WithAttributes(semconv.MessagingMessageID(msg.UUID),
					attribute.String("error", failed.Error())))
			}
		}
	}
	middleware.EndSpan(span, err)
	return err
}

// sharedCorrelationID is the correlation id of msgs when they all have one.
func sharedCorrelationID(msgs []*message.Message) (string, bool) {
	if len(msgs) == 0 {
		return "", false
	}
	c := msgs[0].Metadata.Get(event.HeaderCorrelationID)
	for _, msg := range msgs[1:] {
		if msg.Metadata.Get(event.HeaderCorrelationID) != c {
			return "", false
		}
	}
	return c, c != ""
}
