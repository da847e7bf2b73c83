package router_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/router/catalogtest"
)

// spans records every span the package's tests make; tracing is the global
// provider, which benchmarks switch off or to an exporter.
var (
	spans          = tracetest.NewSpanRecorder()
	tracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	tracing        = newSwitchProvider(tracerProvider)
)

func TestMain(m *testing.M) {
	otel.SetTracerProvider(tracing)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	os.Exit(m.Run())
}

// endedSpans returns the ended spans with that name and correlation id.
func endedSpans(name, correlationID string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() != name {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key == "correlation_id" && a.Value.AsString() == correlationID {
				out = append(out, s)
			}
		}
	}
	return out
}

func TestTracing_CycleAndPublishSpansShareTheRunID(t *testing.T) {
	b := setupPromotion(t, 1)
	purchasetest.SeedActive(t, b.db, 1, time.Now().Add(-time.Minute))
	b.start(t, time.Hour)
	require.Eventually(t, func() bool {
		for _, s := range spans.Ended() {
			if s.Name() != "promotion.expire.cycle" {
				continue
			}
			for _, a := range s.Attributes() {
				if a.Key == "correlation_id" && len(endedSpans("promotion.outbox.publish", a.Value.AsString())) == 1 {
					return true
				}
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "a publish span carries the cycle's run id")
}

func TestTracing_ConsumerReceiveProcessStoreSpansCarryTheCorrelationID(t *testing.T) {
	b := setupCatalog(t, true)
	b.Start(t)
	ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetProject, uuid.New()))
	msg := b.Produce(t, ev) // correlation id "test" is shared; tell spans apart by message id
	var receive sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, s := range endedSpans("catalog.promotion.receive", "test") {
			for _, a := range s.Attributes() {
				if a.Key == "messaging.message.id" && a.Value.AsString() == msg.UUID {
					receive = s
					return true
				}
			}
		}
		return false
	}, 30*time.Second, 10*time.Millisecond)
	var process, store sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() == "catalog.promotion.process" && s.Parent().SpanID() == receive.SpanContext().SpanID() {
			process = s
		}
	}
	require.NotNil(t, process, "process is a child of receive")
	for _, s := range spans.Ended() {
		if s.Name() == "catalog.promotion.store" && s.Parent().SpanID() == process.SpanContext().SpanID() {
			store = s
		}
	}
	require.NotNil(t, store, "store is a child of process")
}

// attr is the value of a span's attribute key, "" when it has none.
func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.Emit()
		}
	}
	return ""
}

// waitSpan waits for the ended span named name whose attribute key is value.
func waitSpan(t *testing.T, name, key, value string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		found = findSpan(name, func(s sdktrace.ReadOnlySpan) bool { return attr(s, key) == value })
		return found != nil
	}, 30*time.Second, 10*time.Millisecond, "no ended span %s with %s=%s", name, key, value)
	return found
}

// findSpan is the first ended span named name that match accepts, or nil.
func findSpan(name string, match func(sdktrace.ReadOnlySpan) bool) sdktrace.ReadOnlySpan {
	for _, s := range spans.Ended() {
		if s.Name() == name && match(s) {
			return s
		}
	}
	return nil
}

// childOf reports whether s is a child of parent, in parent's trace.
func childOf(s sdktrace.ReadOnlySpan, parent trace.SpanContext) bool {
	return s.SpanContext().TraceID() == parent.TraceID() && s.Parent().SpanID() == parent.SpanID()
}

// linksTo reports whether s links to sc.
func linksTo(s sdktrace.ReadOnlySpan, sc trace.SpanContext) bool {
	for _, l := range s.Links() {
		if l.SpanContext.TraceID() == sc.TraceID() && l.SpanContext.SpanID() == sc.SpanID() {
			return true
		}
	}
	return false
}

// requireConsumed checks the consumer's spans of one event below its
// receive span: process, and the unit of work's transaction, the store
// span, which continues the process span (a transaction of this event
// alone) or links to it (one shared with other events). It returns the
// process span.
func requireConsumed(t *testing.T, receive sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	t.Helper()
	require.Equal(t, trace.SpanKindConsumer, receive.SpanKind())
	for _, key := range []string{"messaging.system", "messaging.destination.name", "messaging.consumer.group.name",
		"messaging.kafka.message.key", "messaging.kafka.offset", "messaging.destination.partition.id", "correlation_id"} {
		require.NotEmpty(t, attr(receive, key), "receive span attribute %s", key)
	}
	require.Equal(t, attr(receive, "purchase.id"), attr(receive, "messaging.kafka.message.key"))
	var process sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		process = findSpan("catalog.promotion.process", func(s sdktrace.ReadOnlySpan) bool { return childOf(s, receive.SpanContext()) })
		return process != nil && findSpan("catalog.promotion.store", func(s sdktrace.ReadOnlySpan) bool {
			return childOf(s, process.SpanContext()) || linksTo(s, process.SpanContext())
		}) != nil
	}, 30*time.Second, 10*time.Millisecond, "receive %s has no process span whose transaction's store span continues or links to it",
		receive.SpanContext().SpanID())
	return process
}

// originSpan starts and ends a span that stands for a writer's transaction,
// and returns its context, which the writer's events carry.
func originSpan(name string) (context.Context, trace.SpanContext) {
	ctx, span := tracing.Tracer("test").Start(context.Background(), name)
	span.End()
	return ctx, span.SpanContext()
}
