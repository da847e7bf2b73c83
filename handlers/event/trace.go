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
var TraceHeaders = []string{headerTraceParent, headerTraceState, "baggage"}

// headerTraceParent and headerTraceState are the W3C Trace Context headers,
// which make an event's origin (baggage does not).
const headerTraceParent, headerTraceState = "traceparent", "tracestate"

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

// Origins are the span contexts msgs' metadata carry, in order: the spans
// of the transactions that wrote them. One is not valid when its event has
// none. The events of one writer's transaction are neighbours and carry the
// same trace headers, so each run of equal headers is parsed once.
func Origins(msgs []*message.Message) []trace.SpanContext {
	origins := make([]trace.SpanContext, len(msgs))
	var parent, state string
	for i, msg := range msgs {
		p, s := msg.Metadata.Get(headerTraceParent), msg.Metadata.Get(headerTraceState)
		if i > 0 && p == parent && s == state {
			origins[i] = origins[i-1]
			continue
		}
		parent, state = p, s
		origins[i] = trace.SpanContextFromContext(ExtractTrace(context.Background(), msg))
	}
	return origins
}
