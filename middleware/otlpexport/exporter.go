// Package otlpexport is the processes' OTLP/HTTP span exporter. It is the
// OpenTelemetry exporter's HTTP client (every OTEL_EXPORTER_OTLP_* setting
// of its, retries and compression included) with the spans encoded straight
// from the SDK's read-only spans into protobuf, in a buffer kept from one
// export to the next, instead of being copied into the generated OTLP
// structs first: the consumer exports two spans for every event, and that
// copy and its garbage were most of what tracing cost it.
package otlpexport

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// Exporter sends spans over OTLP/HTTP.
type Exporter struct {
	client   otlptrace.Client
	mu       sync.Mutex // one export at a time: the buffers are reused
	groups   []group
	buf      []byte
	resource []*tracepb.ResourceSpans
	stop     sync.Once
}

// New starts an exporter configured as otlptracehttp.New is, from opts and
// the OTEL_EXPORTER_OTLP_* variables. With http/json as the protocol
// (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL) it is
// the OpenTelemetry exporter itself, which encodes JSON.
func New(ctx context.Context, opts ...otlptracehttp.Option) (sdktrace.SpanExporter, error) {
	if protocolIsJSON() {
		return otlptracehttp.New(ctx, opts...)
	}
	e := &Exporter{client: otlptracehttp.NewClient(opts...)}
	if err := e.client.Start(ctx); err != nil {
		return nil, fmt.Errorf("otlp trace client: %w", err)
	}
	return e, nil
}

func protocolIsJSON() bool {
	p := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if p == "" {
		p = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	return strings.EqualFold(strings.TrimSpace(p), "http/json")
}

// ExportSpans encodes spans, one ResourceSpans a resource, and sends them in
// one request. Each ResourceSpans goes to the client as a message whose
// fields are all in its unknown bytes: protobuf writes those as they are,
// so the request on the wire is the one the generated structs would give.
func (e *Exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.groups = groupSpans(e.groups, spans)
	if len(e.groups) == 0 {
		return nil
	}
	e.buf, e.resource = e.buf[:0], e.resource[:0]
	var starts []int
	for i := 0; i < len(e.groups); {
		j := i + 1
		for j < len(e.groups) && e.groups[j].key == e.groups[i].key {
			j++
		}
		starts = append(starts, len(e.buf))
		e.buf = appendResourceSpans(e.buf, e.groups[i].res, e.groups[i:j])
		i = j
	}
	starts = append(starts, len(e.buf))
	for i := range len(starts) - 1 {
		rs := &tracepb.ResourceSpans{}
		rs.ProtoReflect().SetUnknown(e.buf[starts[i]:starts[i+1]:starts[i+1]])
		e.resource = append(e.resource, rs)
	}
	if err := e.client.UploadTraces(ctx, e.resource); err != nil {
		return fmt.Errorf("traces export: %w", err)
	}
	return nil
}

// Shutdown stops the client; spans exported after it are refused.
func (e *Exporter) Shutdown(ctx context.Context) error {
	var err error
	e.stop.Do(func() { err = e.client.Stop(ctx) })
	return err
}
