package main

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is a trace collector for a test: an OTLP/HTTP endpoint that
// decodes each ExportTraceServiceRequest (protobuf) the processes send and
// keeps its spans.
type otlpReceiver struct {
	URL string
	mu  sync.Mutex
	got []treeSpan
	bad []string
}

// startOTLPReceiver serves /v1/traces until the test ends; point
// OTEL_EXPORTER_OTLP_ENDPOINT at its URL.
func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

func (r *otlpReceiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := r.read(req)
	var export collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &export)
	}
	if err != nil {
		r.mu.Lock()
		r.bad = append(r.bad, err.Error())
		r.mu.Unlock()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.keep(&export)
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *otlpReceiver) read(req *http.Request) ([]byte, error) {
	switch {
	case req.URL.Path != "/v1/traces":
		return nil, fmt.Errorf("export to %s, not /v1/traces", req.URL.Path)
	case req.Header.Get("Content-Type") != "application/x-protobuf":
		return nil, fmt.Errorf("export as %q, not protobuf", req.Header.Get("Content-Type"))
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(req.Body)
		if err != nil {
			return nil, err
		}
		body = gz
	}
	return io.ReadAll(body)
}

// keep adds the spans of export.
func (r *otlpReceiver) keep(export *collectortrace.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range export.GetResourceSpans() {
		service := attrsOf(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				ts := treeSpan{TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentID: hex.EncodeToString(s.GetParentSpanId()), Name: s.GetName(), Service: service,
					Kind:  strings.ToLower(strings.TrimPrefix(s.GetKind().String(), "SPAN_KIND_")),
					Attrs: attrsOf(s.GetAttributes())}
				for _, l := range s.GetLinks() {
					ts.Links = append(ts.Links, hex.EncodeToString(l.GetTraceId())+"/"+hex.EncodeToString(l.GetSpanId()))
				}
				r.got = append(r.got, ts)
			}
		}
	}
}

// trace is every span received of the trace id.
func (r *otlpReceiver) trace(id string) spanTree {
	r.mu.Lock()
	defer r.mu.Unlock()
	var tr spanTree
	for _, s := range r.got {
		if s.TraceID == id {
			tr.add(s)
		}
	}
	return tr
}

// find is the first span received that match accepts.
func (r *otlpReceiver) find(match func(treeSpan) bool) (treeSpan, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.got {
		if match(s) {
			return s, true
		}
	}
	return treeSpan{}, false
}

// errors are the exports it could not read.
func (r *otlpReceiver) errors() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bad...)
}

func attrsOf(kvs []*commonpb.KeyValue) map[string]string {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch v.GetValue().(type) {
		case *commonpb.AnyValue_IntValue:
			out[kv.GetKey()] = fmt.Sprint(v.GetIntValue())
		case *commonpb.AnyValue_BoolValue:
			out[kv.GetKey()] = fmt.Sprint(v.GetBoolValue())
		case *commonpb.AnyValue_DoubleValue:
			out[kv.GetKey()] = fmt.Sprint(v.GetDoubleValue())
		default:
			out[kv.GetKey()] = v.GetStringValue()
		}
	}
	return out
}
