package middleware_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/middleware/otlpexport"
)

// benchTracing is the provider of BenchmarkTracing_ConsumerSpansPerEvent,
// set once: the package's tracer follows the first provider set globally.
var benchTracing struct {
	once sync.Once
	tp   *sdktrace.TracerProvider
}

// BenchmarkTracing_ConsumerSpansPerEvent measures what the consumer's spans
// of one event cost with tracing on as a process runs it (the default
// sampler, a batch span processor, OTLP/HTTP export to a receiver that
// drops what it reads): receive and process around a handler that does
// nothing, and the store span of a transaction of storeBatch events, linked
// to each one's process span, for records that carry a writer's sampled
// traceparent. The
// processor blocks instead of dropping spans, so that every span is
// exported and paid for. It reports the process's CPU time per event,
// export included: the part of the consumer's CPU per event that tracing
// adds (BenchmarkConsumerTracing measures it inside the whole consumer).
func BenchmarkTracing_ConsumerSpansPerEvent(b *testing.B) {
	benchTracing.once.Do(func() {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/x-protobuf")
		}))
		exp, err := otlpexport.New(context.Background(), otlptracehttp.WithEndpointURL(srv.URL+"/v1/traces"))
		require.NoError(b, err)
		benchTracing.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBlocking()))
		otel.SetTracerProvider(benchTracing.tp)
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	})
	// storeBatch is about the consumer's events per transaction (BenchmarkConsumer).
	const storeBatch = 39
	origins := make([]trace.SpanContext, 0, storeBatch)
	h := chain(func(msg *message.Message) ([]*message.Message, error) {
		if origins = append(origins, trace.SpanContextFromContext(msg.Context())); len(origins) == storeBatch {
			_, span := middleware.StartBatchSpan("catalog.promotion.store", trace.SpanKindInternal, origins)
			span.End()
			origins = origins[:0]
		}
		return nil, nil
	},
		middleware.Receive("catalog.promotion.receive", "bench"),
		middleware.Span("catalog.promotion.process", trace.SpanKindInternal))
	msgs := make([]*message.Message, 1024)
	for i := range msgs {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		msg.Metadata.Set(event.HeaderAggregateID, uuid.NewString())
		msg.Metadata.Set(event.HeaderCorrelationID, uuid.NewString())
		msg.Metadata.Set(event.HeaderTenantID, uuid.NewString())
		msg.Metadata.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
		msgs[i] = msg
	}
	b.ReportAllocs()
	before := cpuTime()
	b.ResetTimer()
	for i := range b.N {
		_, _ = h(msgs[i%len(msgs)])
	}
	require.NoError(b, benchTracing.tp.ForceFlush(context.Background()))
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-before).Nanoseconds())/1e3/float64(b.N), "cpu-us/event")
}

// cpuTime is the CPU time the process used so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
