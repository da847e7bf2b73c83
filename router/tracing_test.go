package router_test

import (
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/router/catalogtest"
)

// spans records every span the package's tests make.
var (
	spans          = tracetest.NewSpanRecorder()
	tracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
)

func TestMain(m *testing.M) {
	otel.SetTracerProvider(tracerProvider)
	os.Exit(m.Run())
}

// withoutSpanRecording stops recording spans until b ends: the recorder keeps
// every span, and a benchmark's would count in its memory.
func withoutSpanRecording(b *testing.B) {
	tracerProvider.UnregisterSpanProcessor(spans)
	b.Cleanup(func() { tracerProvider.RegisterSpanProcessor(spans) })
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
