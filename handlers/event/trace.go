package event

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TraceHeaders are the metadata keys, and so the Kafka record headers, that
// carry an event's trace context with the default propagators (W3C Trace
// Context and Baggage). Each is optional: an event written without a span
// has none, and tracestate and baggage appear only when set.
var TraceHeaders = []string{"traceparent", "tracestate", "baggage"}

// InjectTrace writes the span context and baggage of ctx into msg's metadata
// with the process's propagator (OTEL_PROPAGATORS), so that the event carries
// its creation context through the outbox row and the Kafka record to the
// consumer, and one change is one trace. Without a span in ctx it writes
// nothing.
func InjectTrace(ctx context.Context, msg *message.Message) {
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(msg.Metadata))
}

// ExtractTrace returns ctx with the span context and baggage that msg's
// metadata carries, as the consumer and the relay continue them.
func ExtractTrace(ctx context.Context, msg *message.Message) context.Context {
	return otel.GetTextMapPropagator().Extract(ctx, propagation.MapCarrier(msg.Metadata))
}

// Origin is the span context msg's metadata carries: the span of the
// transaction that wrote the event. It is not valid when there is none.
func Origin(msg *message.Message) trace.SpanContext {
	return trace.SpanContextFromContext(ExtractTrace(context.Background(), msg))
}
