package otlpexport_test

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/promoflow/promoflow/middleware/otlpexport"
)

// receiver keeps the body of each export it is sent, decoded.
type receiver struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []*coltracepb.ExportTraceServiceRequest
	enc  []string
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body := req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = gz
		}
		raw, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		m := &coltracepb.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(raw, m); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.reqs, r.enc = append(r.reqs, m), append(r.enc, req.Header.Get("Content-Encoding"))
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) last(t *testing.T) *coltracepb.ExportTraceServiceRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	require.NotEmpty(t, r.reqs, "the receiver got no export")
	return r.reqs[len(r.reqs)-1]
}

// spans are read-only spans of every shape the exporter meets: attributes of
// every type, events, links with attributes and flags, remote and local
// parents, trace state, a status, dropped counts, two scopes and two
// resources interleaved, and fields long enough that their lengths take two
// and three bytes.
func spans(t *testing.T) []sdktrace.ReadOnlySpan {
	tid := trace.TraceID{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c}
	ts, err := trace.ParseTraceState("vendor=a,other=b")
	require.NoError(t, err)
	sc := func(sid byte, remote bool, flags trace.TraceFlags) trace.SpanContext {
		return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{sid, 1, 2, 3, 4, 5, 6, 7},
			TraceFlags: flags, TraceState: ts, Remote: remote})
	}
	resA := resource.NewSchemaless(attribute.String("service.name", "promoflow-catalog"), attribute.Int("n", 1))
	resB := resource.NewWithAttributes("https://opentelemetry.io/schemas/1.26.0", attribute.String("service.name", "b"))
	ours := instrumentation.Scope{Name: "github.com/promoflow/promoflow"}
	http := instrumentation.Scope{Name: "otelhttp", Version: "0.1", SchemaURL: "https://opentelemetry.io/schemas/1.26.0",
		Attributes: attribute.NewSet(attribute.Bool("x", true))}
	start := time.Date(2026, 12, 6, 12, 0, 0, 123, time.UTC)
	every := []attribute.KeyValue{
		attribute.String("s", "v"), attribute.String("empty", ""), attribute.Bool("f", false), attribute.Bool("t", true),
		attribute.Int64("zero", 0), attribute.Int64("neg", -42), attribute.Float64("pi", 3.14159), attribute.Float64("z", 0),
		attribute.StringSlice("ss", []string{"a", "", "c"}), attribute.BoolSlice("bs", []bool{true, false}),
		attribute.Int64Slice("is", []int64{1, -1, 0}), attribute.Float64Slice("fs", []float64{0.5, 0}),
		{Key: "none"},
	}
	stubs := tracetest.SpanStubs{
		{Name: "catalog.promotion.receive", SpanContext: sc(1, false, trace.FlagsSampled), Parent: sc(9, true, trace.FlagsSampled),
			SpanKind: trace.SpanKindConsumer, StartTime: start, EndTime: start.Add(time.Millisecond), Attributes: every,
			DroppedAttributes: 3, Resource: resA, InstrumentationScope: ours},
		{Name: "catalog.promotion.store", SpanContext: sc(2, false, trace.FlagsSampled), SpanKind: trace.SpanKindInternal,
			StartTime: start, EndTime: start.Add(2 * time.Millisecond), Resource: resA, InstrumentationScope: ours,
			Links: []sdktrace.Link{{SpanContext: sc(3, true, trace.FlagsSampled)}, {SpanContext: sc(4, false, 0),
				Attributes: []attribute.KeyValue{attribute.String("k", "v")}, DroppedAttributeCount: 2}},
			DroppedLinks: 5, Status: sdktrace.Status{Code: codes.Error, Description: "deadlock detected"},
			Events: []sdktrace.Event{{Name: "exception", Time: start.Add(time.Microsecond),
				Attributes: []attribute.KeyValue{attribute.String("exception.message", "boom")}, DroppedAttributeCount: 1}},
			DroppedEvents: 7},
		{Name: "POST /promotions", SpanContext: sc(5, false, trace.FlagsSampled), Parent: sc(6, false, trace.FlagsSampled),
			SpanKind: trace.SpanKindServer, StartTime: start, EndTime: start.Add(time.Second), Resource: resB, InstrumentationScope: http,
			Status: sdktrace.Status{Code: codes.Ok}},
		{Name: "store", SpanContext: sc(7, false, 0), Resource: resA, InstrumentationScope: http,
			Attributes: []attribute.KeyValue{attribute.String("long", strings.Repeat("x", 20000))}},
		{Name: "no scope, no kind", SpanContext: sc(8, false, trace.FlagsSampled), Resource: resB, SpanKind: trace.SpanKind(42)},
	}
	for i := range 600 {
		stubs = append(stubs, tracetest.SpanStub{Name: fmt.Sprintf("process %d", i), SpanContext: sc(byte(i), false, trace.FlagsSampled),
			Parent: sc(1, false, trace.FlagsSampled), SpanKind: trace.SpanKindInternal, StartTime: start, EndTime: start.Add(time.Duration(i)),
			Resource: resA, InstrumentationScope: ours, Attributes: []attribute.KeyValue{attribute.Int("i", i)}})
	}
	return stubs.Snapshots()
}

// sameRequest fails unless got holds want's resource spans, whatever their
// order (the OpenTelemetry exporter's comes from a map).
func sameRequest(t *testing.T, want, got *coltracepb.ExportTraceServiceRequest) {
	t.Helper()
	require.Len(t, got.ResourceSpans, len(want.ResourceSpans))
	for _, w := range want.ResourceSpans {
		var closest *tracepb.ResourceSpans
		for _, g := range got.ResourceSpans {
			if proto.Equal(w, g) {
				closest = nil
				break
			}
			if proto.Equal(w.Resource, g.Resource) {
				closest = g
			}
		}
		if closest != nil || len(got.ResourceSpans) == 0 {
			t.Fatalf("the export differs from the OpenTelemetry exporter's for resource %v: %s", w.Resource, firstDifference(w, closest))
		}
	}
}

// firstDifference names the first scope or span of want that got does not
// hold as it is, and shows both, cut short.
func firstDifference(want, got *tracepb.ResourceSpans) string {
	if got == nil {
		return "no ResourceSpans of that resource"
	}
	short := func(m proto.Message) string {
		s := prototext.Format(m)
		if len(s) > 600 {
			s = s[:600] + "…"
		}
		return s
	}
	for i, ws := range want.ScopeSpans {
		if i >= len(got.ScopeSpans) {
			return fmt.Sprintf("scope %q missing", ws.Scope.GetName())
		}
		gs := got.ScopeSpans[i]
		for j, w := range ws.Spans {
			if j >= len(gs.Spans) {
				return fmt.Sprintf("span %q missing", w.Name)
			}
			if !proto.Equal(w, gs.Spans[j]) {
				return fmt.Sprintf("span %q\nwant %s\ngot  %s", w.Name, short(w), short(gs.Spans[j]))
			}
		}
		if !proto.Equal(ws, gs) {
			return fmt.Sprintf("scope %q\nwant %s\ngot  %s", ws.Scope.GetName(), short(ws.Scope), short(gs.Scope))
		}
	}
	return fmt.Sprintf("resource spans\nwant %s\ngot  %s", short(want), short(got))
}

// TestExporter_SendsWhatTheOpenTelemetryExporterSends exports the same spans
// through otlptracehttp's own exporter and through ours, and compares the
// decoded requests, twice, so that a buffer kept from the first export
// shows in the second.
func TestExporter_SendsWhatTheOpenTelemetryExporterSends(t *testing.T) {
	ctx := context.Background()
	theirs, ours := newReceiver(t), newReceiver(t)
	ref, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(theirs.URL+"/v1/traces"))
	require.NoError(t, err)
	exp, err := otlpexport.New(ctx, otlptracehttp.WithEndpointURL(ours.URL+"/v1/traces"))
	require.NoError(t, err)
	require.IsType(t, &otlpexport.Exporter{}, exp)
	all := spans(t)
	for _, batch := range [][]sdktrace.ReadOnlySpan{all, all[:3], append([]sdktrace.ReadOnlySpan{nil}, all[1:2]...)} {
		require.NoError(t, ref.ExportSpans(ctx, batch))
		require.NoError(t, exp.ExportSpans(ctx, batch))
		sameRequest(t, theirs.last(t), ours.last(t))
	}
	require.NoError(t, exp.ExportSpans(ctx, nil))
	require.NoError(t, exp.Shutdown(ctx))
	require.NoError(t, ref.Shutdown(ctx))
}

// TestExporter_FollowsTheExportersEnvironment: the client reads the
// OTEL_EXPORTER_OTLP_* variables (here the endpoint, a header and gzip),
// and http/json hands the export to the OpenTelemetry exporter.
func TestExporter_FollowsTheExportersEnvironment(t *testing.T) {
	ctx := context.Background()
	r := newReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", r.URL+"/v1/traces")
	t.Setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
	exp, err := otlpexport.New(ctx)
	require.NoError(t, err)
	all := spans(t)
	require.NoError(t, exp.ExportSpans(ctx, all[:2]))
	require.Equal(t, "gzip", r.enc[len(r.enc)-1])
	require.Len(t, r.last(t).ResourceSpans[0].ScopeSpans[0].Spans, 2)
	require.NoError(t, exp.Shutdown(ctx))

	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	exp, err = otlpexport.New(ctx)
	require.NoError(t, err)
	require.NotEqual(t, fmt.Sprintf("%T", &otlpexport.Exporter{}), fmt.Sprintf("%T", exp))
	require.NoError(t, exp.Shutdown(ctx))
}
