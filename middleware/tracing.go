package middleware

import (
	"context"
	"strconv"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/event"
)

// tracer names promoflow's message spans. It follows the global provider,
// which the process sets up from OTEL_* variables (a no-op when none are given).
var tracer = otel.Tracer("github.com/promoflow/promoflow")

// Span opens a span named name around the rest of the chain, as a child of
// the span the message's context holds, with the message's attributes (its
// id, correlation id and purchase id, and where Kafka had it), and records
// the chain's error. Placed outermost as the consumer's receive span, and
// again further in, it gives the receive → process → store spans whose
// correlation id a trace search joins.
func Span(name string, kind trace.SpanKind) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ctx, span := StartSpan(msg.Context(), name, kind, msg)
			defer span.End()
			parent := msg.Context()
			msg.SetContext(ctx)
			out, err := h(msg)
			msg.SetContext(parent)
			EndSpan(span, err)
			return out, err
		}
	}
}

// StartSpan opens a span for one message, with MessageAttrs and extra. The
// attributes are made only for a span that records: without a trace
// exporter every span is a no-op, and the consumer opens three per event.
func StartSpan(ctx context.Context, name string, kind trace.SpanKind, msg *message.Message, extra ...attribute.KeyValue) (context.Context, trace.Span) {
	ctx, span := tracer.Start(ctx, name, trace.WithSpanKind(kind))
	if span.IsRecording() {
		span.SetAttributes(MessageAttrs(msg)...)
		span.SetAttributes(extra...)
	}
	return ctx, span
}

// EndSpan marks span failed when err is not nil.
func EndSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}

// MessageAttrs are the span attributes of one event message.
func MessageAttrs(msg *message.Message) []attribute.KeyValue {
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
