package dlqreplay

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
)

// tracer names the replay's spans; it follows the global provider.
var tracer = otel.Tracer("github.com/promoflow/promoflow/router/dlqreplay")

// startRun opens the span of one replay run (catalog.promotion.dlq-replay),
// a trace of its own that each replayed record's span links to.
func (r *Replayer) startRun(ctx context.Context) (context.Context, trace.Span) {
	return tracer.Start(ctx, "catalog.promotion.dlq-replay", trace.WithAttributes(
		semconv.MessagingSystemKafka, attribute.String("dlq.topic", r.cfg.DLQTopic),
		attribute.String("replay.topic", r.cfg.ReplayTopic), semconv.MessagingConsumerGroupName(r.cfg.Group),
		attribute.Bool("dry_run", r.cfg.DryRun)))
}

// endRun records the run's counts on its span and ends it.
func (r *Replayer) endRun(span trace.Span, err error) {
	c := r.progress.Snapshot()
	span.SetAttributes(attribute.Int64("read_count", c.Read), attribute.Int64("replayed_count", c.Replayed),
		attribute.Int64("parked_count", c.Parked))
	middleware.EndSpan(span, err)
	span.End()
}

// tracingPublisher opens a span per replayed record (catalog.promotion.replay)
// in the trace of the change it belongs to: the child of the creation context
// its headers carry, which the record keeps, so the consumer's receive of the
// replay continues that trace too. Each span links to the run's.
type tracingPublisher struct {
	message.Publisher
	run trace.SpanContext
}

func (p tracingPublisher) Publish(topic string, msgs ...*message.Message) error {
	spans := make([]trace.Span, len(msgs))
	for i, msg := range msgs {
		_, spans[i] = middleware.StartSpan(event.ExtractTrace(context.Background(), msg), "catalog.promotion.replay",
			trace.SpanKindProducer, msg, semconv.MessagingDestinationName(topic), semconv.MessagingOperationTypeSend,
			attribute.String("dlq.error_code", msg.Metadata.Get(middleware.HeaderDLQErrorCode)),
			attribute.String("dlq.replay_count", msg.Metadata.Get(middleware.HeaderDLQReplayCount)))
		spans[i].AddLink(trace.Link{SpanContext: p.run})
	}
	err := p.Publisher.Publish(topic, msgs...)
	for _, span := range spans {
		middleware.EndSpan(span, err)
		span.End()
	}
	return err
}
