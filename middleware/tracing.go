package middleware

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"sync"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/event"
)

// tracer names promoflow's message spans. It follows the global provider,
// which the process sets up from OTEL_* variables (a no-op when none are given).
var tracer = otel.Tracer("github.com/promoflow/promoflow")

// Receive opens the consumer's receive span named name around the rest of
// the chain. It continues the trace context the record's headers carry, the
// event's creation context (messaging semantic conventions: the consumer
// span is its child), so that an event's consumption is in the trace of the
// change that made it; a record without one starts a trace of its own.
// group is the consumer group, an attribute of the span.
func Receive(name, group string) message.HandlerMiddleware {
	return spanMiddleware(name, trace.SpanKindConsumer, func(msg *message.Message) context.Context {
		return event.ExtractTrace(msg.Context(), msg)
	}, appendMessageAttrs, semconv.MessagingConsumerGroupName(group), semconv.MessagingOperationTypeReceive)
}

// Span opens a span named name around the rest of the chain, as a child of
// the span the message's context holds, and records the chain's error.
// Inside Receive it gives the process → store spans. They carry no
// attributes of their own: the message's id, correlation id, purchase and
// where Kafka had it are on the receive span, their parent, which a trace
// search by correlation_id finds with its whole trace. Every attribute is
// paid for per event, when the span starts and again when it is exported.
func Span(name string, kind trace.SpanKind) message.HandlerMiddleware {
	return spanMiddleware(name, kind, (*message.Message).Context, nil)
}

func spanMiddleware(name string, kind trace.SpanKind, parent func(*message.Message) context.Context,
	attrs appendAttrs, extra ...attribute.KeyValue) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ctx, span := startSpan(parent(msg), name, kind, msg, attrs, extra...)
			defer span.End()
			restore := msg.Context()
			msg.SetContext(ctx)
			out, err := h(msg)
			msg.SetContext(restore)
			EndSpan(span, err)
			return out, err
		}
	}
}

// appendAttrs appends a message's span attributes to dst.
type appendAttrs func(dst []attribute.KeyValue, msg *message.Message) []attribute.KeyValue

// StartSpan opens a span for one message, with the message's attributes (appendMessageAttrs) and extra. The
// attributes are made only for a span that records: without a trace
// exporter every span is a no-op, and the consumer opens two per event.
func StartSpan(ctx context.Context, name string, kind trace.SpanKind, msg *message.Message, extra ...attribute.KeyValue) (context.Context, trace.Span) {
	return startSpan(ctx, name, kind, msg, appendMessageAttrs, extra...)
}

// attrBuffers hold the attributes of a span while it starts: the SDK
// copies them into the span, so one buffer serves span after span.
var attrBuffers = sync.Pool{New: func() any { return new([16]attribute.KeyValue) }}

func startSpan(ctx context.Context, name string, kind trace.SpanKind, msg *message.Message,
	attrs appendAttrs, extra ...attribute.KeyValue) (context.Context, trace.Span) {
	ctx, span := tracer.Start(ctx, name, trace.WithSpanKind(kind))
	if !span.IsRecording() || (attrs == nil && len(extra) == 0) {
		return ctx, span
	}
	buf := attrBuffers.Get().(*[16]attribute.KeyValue)
	a := buf[:0]
	if attrs != nil {
		a = attrs(a, msg)
	}
	a = append(a, extra...)
	span.SetAttributes(a...)
	clear(buf[:min(len(a), len(buf))]) // a outgrows buf past 16 attributes
	attrBuffers.Put(buf)
	return ctx, span
}

// StartBatchSpan opens a span for work done once for items of several
// origins (the span contexts that made them): one Kafka request of the
// relay, one transaction of the consumer. Per the messaging semantic
// conventions for batches, when every item has one origin the span is that
// origin's child, so that it stays in that change's trace; otherwise it
// starts a trace of its own and links to each distinct origin. Items
// without an origin add none.
func StartBatchSpan(name string, kind trace.SpanKind, origins []trace.SpanContext, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	links := make([]trace.Link, 0, len(origins))
	for _, o := range origins {
		if o.IsValid() {
			links = append(links, trace.Link{SpanContext: o})
		}
	}
	// Distinct origins, without a map: sorted, equal ones are neighbours.
	slices.SortFunc(links, compareLinks)
	links = slices.CompactFunc(links, func(a, b trace.Link) bool { return compareLinks(a, b) == 0 })
	opts := []trace.SpanStartOption{trace.WithSpanKind(kind), trace.WithAttributes(attrs...)}
	ctx := context.Background()
	switch len(links) {
	case 0:
	case 1:
		ctx = trace.ContextWithRemoteSpanContext(ctx, links[0].SpanContext)
	default:
		opts = append(opts, trace.WithNewRoot(), trace.WithLinks(links...))
	}
	return tracer.Start(ctx, name, opts...)
}

// compareLinks orders links by their trace id, then span id.
func compareLinks(a, b trace.Link) int {
	at, bt := a.SpanContext.TraceID(), b.SpanContext.TraceID()
	if c := bytes.Compare(at[:], bt[:]); c != 0 {
		return c
	}
	as, bs := a.SpanContext.SpanID(), b.SpanContext.SpanID()
	return bytes.Compare(as[:], bs[:])
}

// EndSpan marks span failed when err is not nil.
func EndSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}

// appendMessageAttrs appends the span attributes of one event message
// (messaging semantic conventions, and the seed's correlation id as
// correlation_id): its id, correlation id, purchase and tenant, and where
// Kafka had it.
func appendMessageAttrs(attrs []attribute.KeyValue, msg *message.Message) []attribute.KeyValue {
	attrs = append(attrs, semconv.MessagingSystemKafka,
		attribute.String("tenant.id", msg.Metadata.Get(event.HeaderTenantID)),
		semconv.MessagingMessageID(msg.UUID),
		attribute.String("correlation_id", msg.Metadata.Get(event.HeaderCorrelationID)),
		attribute.String("purchase.id", msg.Metadata.Get(event.HeaderAggregateID)))
	ctx := msg.Context()
	if topic := message.SubscribeTopicFromCtx(ctx); topic != "" {
		attrs = append(attrs, semconv.MessagingDestinationName(topic))
	}
	if key, ok := kafka.MessageKeyFromCtx(ctx); ok && key != nil {
		attrs = append(attrs, semconv.MessagingKafkaMessageKey(string(key)))
	}
	if p, ok := kafka.MessagePartitionFromCtx(ctx); ok {
		attrs = append(attrs, semconv.MessagingDestinationPartitionID(strconv.Itoa(int(p))))
	}
	if o, ok := kafka.MessagePartitionOffsetFromCtx(ctx); ok {
		attrs = append(attrs, semconv.MessagingKafkaOffset(int(o)))
	}
	return attrs
}
