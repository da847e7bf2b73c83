package router

import (
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// tracingPublisher opens a publish span per event the relay sends. The events
// of one outbox row go to Kafka in one round trip, so their spans share it; each
// ends with its own record's outcome.
type tracingPublisher struct{ message.Publisher }

func (p tracingPublisher) Publish(topic string, msgs ...*message.Message) error {
	spans := make([]trace.Span, len(msgs))
	for i, msg := range msgs {
		_, spans[i] = middleware.StartSpan(msg.Context(), "promotion.outbox.publish", trace.SpanKindProducer, msg,
			attribute.String("messaging.destination.name", topic), attribute.Int("messaging.batch.message_count", len(msgs)))
	}
	err := p.Publisher.Publish(topic, msgs...)
	for i, msg := range msgs {
		middleware.EndSpan(spans[i], kafkakit.MessageError(err, msg.UUID))
		spans[i].End()
	}
	return err
}
