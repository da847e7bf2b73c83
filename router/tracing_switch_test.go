package router_test

import (
	"context"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware/otlpexport"
)

// switchProvider is the tests' global tracer provider. The global provider
// hands its first provider to every tracer made before it (promoflow's are
// package variables), so a benchmark cannot replace it; this one sends
// every span to the provider set last: the tests' span recorder, nothing
// (tracing off, as in a process without OTEL_EXPORTER_OTLP_ENDPOINT), or an
// exporting SDK (tracing on).
type switchProvider struct {
	embedded.TracerProvider
	current atomic.Pointer[trace.TracerProvider]
}

func newSwitchProvider(tp trace.TracerProvider) *switchProvider {
	p := &switchProvider{}
	p.set(tp)
	return p
}

func (p *switchProvider) set(tp trace.TracerProvider) { p.current.Store(&tp) }

func (p *switchProvider) get() trace.TracerProvider { return *p.current.Load() }

func (p *switchProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return &switchTracer{p: p, name: name, opts: opts}
}

type switchTracer struct {
	embedded.Tracer
	p      *switchProvider
	name   string
	opts   []trace.TracerOption
	cached atomic.Pointer[resolvedTracer]
}

// resolvedTracer is a tracer of one provider, made once per switch.
type resolvedTracer struct {
	tp trace.TracerProvider
	tr trace.Tracer
}

func (t *switchTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	tp := t.p.get()
	r := t.cached.Load()
	if r == nil || r.tp != tp {
		r = &resolvedTracer{tp: tp, tr: tp.Tracer(t.name, t.opts...)}
		t.cached.Store(r)
	}
	return r.tr.Start(ctx, name, opts...)
}

// withoutSpanRecording turns tracing off until b ends: spans are no-ops, as
// in a process that exports none. (The recorder keeps every span, and a
// benchmark's would count in its memory.)
func withoutSpanRecording(b *testing.B) {
	tracing.set(noop.NewTracerProvider())
	b.Cleanup(func() { tracing.set(tracerProvider) })
}

// tracingOn turns tracing on as a process with OTEL_EXPORTER_OTLP_ENDPOINT
// has it (the default sampler, a batch span processor, the OTLP/HTTP
// exporter) towards a receiver that reads and drops every export, until
// the returned func, which flushes the spans, turns it off again.
func tracingOn(b *testing.B) (off func()) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	exp, err := otlpexport.New(b.Context(), otlptracehttp.WithEndpointURL(srv.URL+"/v1/traces"))
	require.NoError(b, err)
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	tracing.set(tp)
	return func() {
		tracing.set(noop.NewTracerProvider())
		require.NoError(b, tp.Shutdown(context.Background()))
		srv.Close()
	}
}

// tracingIsOn reports whether spans are exported or recorded now.
func tracingIsOn() bool {
	_, isNoop := tracing.get().(noop.TracerProvider)
	return !isNoop
}

// traceWrites gives each group of msgs the creation context of a writer's
// transaction of its own, as the API's and the expirer's do, when tracing is
// on. The writers' spans are made up (no span is started): a benchmark
// measures the relay and the consumer, not the writers.
func traceWrites(groups ...[]*message.Message) {
	if !tracingIsOn() {
		return
	}
	for _, msgs := range groups {
		var tid trace.TraceID
		var sid trace.SpanID
		binary.BigEndian.PutUint64(tid[:8], rand.Uint64())
		binary.BigEndian.PutUint64(tid[8:], rand.Uint64())
		binary.BigEndian.PutUint64(sid[:], rand.Uint64()|1)
		ctx := trace.ContextWithSpanContext(context.Background(),
			trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
		for _, msg := range msgs {
			event.InjectTrace(ctx, msg)
		}
	}
}

// tracingSides runs side with tracing off and on, in the order turn says, and
// returns what each measured. Each side runs under the pprof label
// tracing=off or tracing=on, which the goroutines it starts inherit, so that
// a CPU profile of the benchmark (-cpuprofile) tells the sides apart
// (go tool pprof -tagfocus tracing=on); the runtime's own work (the garbage
// collector, the scheduler) and goroutines started before it stay unlabelled.
func tracingSides[T any](b *testing.B, turn int, side func() T) (off, on T) {
	runOn := func() {
		pprof.Do(b.Context(), pprof.Labels("tracing", "on"), func(context.Context) {
			stop := tracingOn(b)
			defer stop()
			on = side()
		})
	}
	runOff := func() {
		pprof.Do(b.Context(), pprof.Labels("tracing", "off"), func(context.Context) { off = side() })
	}
	inTurn(turn, runOff, runOn)
	return off, on
}

// inTurn runs first then second on an even turn and second then first on an
// odd one, so that a drift of the machine over a run weighs on both sides of
// the pairs alike.
func inTurn(turn int, first, second func()) {
	if turn%2 == 1 {
		first, second = second, first
	}
	first()
	second()
}
