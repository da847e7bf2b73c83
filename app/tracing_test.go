package main

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
)

func TestTracing_PropagatorsFollowOTEL_PROPAGATORS(t *testing.T) {
	for value, fields := range map[string][]string{
		"":                         {"traceparent", "tracestate", "baggage"},
		"tracecontext,baggage":     {"traceparent", "tracestate", "baggage"},
		" TraceContext ":           {"traceparent", "tracestate"},
		"baggage":                  {"baggage"},
		"none":                     nil,
		"tracecontext,none":        nil,
		"b3,tracecontext,jaeger":   {"traceparent", "tracestate"}, // unknown ones are reported and ignored
		"tracecontext,,tracestate": {"traceparent", "tracestate"},
	} {
		require.ElementsMatch(t, fields, propagatorFromEnv(value).Fields(), "OTEL_PROPAGATORS=%q", value)
	}
}

// TestTracing_ServerSpanContinuesTheCallerAndNamesTheRoute: an API request's
// server span is a child of its traceparent when the caller is trusted, is named after the route the
// mux matched, and the answer's traceresponse names it; the operations
// endpoints get no span.
func TestTracing_ServerSpanContinuesTheCallerAndNamesTheRoute(t *testing.T) {
	rec := recordedSpans()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /promotions/{id}/cancel", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusConflict) })
	mux.HandleFunc("GET /healthz", func(http.ResponseWriter, *http.Request) {})
	h := serverSpans(mux, apiPropagation{TraceParentTrusted: true})

	const traceID, caller = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req := httptest.NewRequest("POST", "/promotions/42/cancel", nil)
	req.Header.Set("traceparent", "00-"+traceID+"-"+caller+"-01")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	require.Equal(t, http.StatusConflict, w.Code)
	var server treeSpan
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID().String() == traceID {
			server = recordedSpan(s)
			require.Equal(t, trace.SpanKindServer, s.SpanKind())
		}
	}
	require.Equal(t, "POST /promotions/{id}/cancel", server.Name)
	require.Equal(t, caller, server.ParentID)
	require.Equal(t, "/promotions/{id}/cancel", server.Attrs["http.route"])
	require.Equal(t, "409", server.Attrs["http.response.status_code"])
	require.Equal(t, "00-"+traceID+"-"+server.SpanID+"-01", w.Header().Get(traceResponseHeader))

	before := len(rec.Ended())
	probe := httptest.NewRecorder()
	h.ServeHTTP(probe, httptest.NewRequest("GET", "/healthz", nil))
	require.Empty(t, probe.Header().Get(traceResponseHeader))
	for _, s := range rec.Ended()[before:] {
		require.NotEqual(t, "GET /healthz", s.Name(), "no span for a probe")
	}
}
