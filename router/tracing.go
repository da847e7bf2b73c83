package router

import (
	"strconv"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// tracer names promoflow's spans. It follows the global provider, which the
// process sets up from OTEL_* variables (a no-op when none are given).
var tracer = otel.Tracer("github.com/promoflow/promoflow/router")

// messageAttrs are the span attributes of one event message.
func messageAttrs(msg *message.Message) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "kafka"),
		attribute.String("messaging.message.id", msg.UUID),
		attribute.String("correlation_id", msg.Metadata.Get(event.HeaderCorrelationID)),
		attribute.String("purchase.id", msg.Metadata.Get(event.HeaderAggregateID)),
	}
	if topic := message.SubscribeTopicFromCtx(msg.Context()); topic != "" {
		attrs = append(attrs, attribute.String("messaging.destination.name", topic))
	}
	if p, ok := kafka.MessagePartitionFromCtx(msg.Context()); ok {
		attrs = append(attrs, attribute.String("messaging.kafka.partition", strconv.Itoa(int(p))))
	}
	if o, ok := kafka.MessagePartitionOffsetFromCtx(msg.Context()); ok {
		attrs = append(attrs, attribute.Int64("messaging.kafka.offset", o))
	}
	return attrs
}

// traceReceive opens the consumer's receive span, outermost in the chain; the
// process and store spans are its children through the message context.
func traceReceive(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx, span := tracer.Start(msg.Context(), "catalog.promotion.receive",
			trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(messageAttrs(msg)...))
		defer span.End()
		msg.SetContext(ctx)
		out, err := h(msg)
		endSpan(span, err)
		return out, err
	}
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}

// tracingPublisher opens a publish span per event the relay sends. The events
// of one outbox row go to Kafka in one round trip, so their spans share it; each
// ends with its own record's outcome.
type tracingPublisher struct{ message.Publisher }

func (p tracingPublisher) Publish(topic string, msgs ...*message.Message) error {
	spans := make([]trace.Span, len(msgs))
	for i, msg := range msgs {
		_, spans[i] = tracer.Start(msg.Context(), "promotion.outbox.publish", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(append(messageAttrs(msg), attribute.String("messaging.destination.name", topic),
				attribute.Int("messaging.batch.message_count", len(msgs)))...))
	}
	err := p.Publisher.Publish(topic, msgs...)
	for i, msg := range msgs {
		endSpan(spans[i], kafkakit.MessageError(err, msg.UUID))
		spans[i].End()
	}
	return err
}
