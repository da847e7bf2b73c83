package main

import (
	"net/http"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/app/api"
)

// httpTracer names the APIs' server spans; it follows the global provider.
var httpTracer = otel.Tracer("github.com/promoflow/promoflow/app")

// traceResponseHeader is the answer's header that names its trace: W3C Trace
// Context Level 2's traceresponse, "00-<trace id>-<span id of the server
// span>-<flags>", for a support request to quote.
const traceResponseHeader = "traceresponse"

// untracedPaths are the operations endpoints, which a scraper and a prober
// call every few seconds: a span for each would bury the API's.
var untracedPaths = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// serverSpans opens a server span per API request (HTTP semantic
// conventions) and answers with traceresponse. The caller's trace headers
// pass through edge (apiPropagation.extract) first: what it keeps is the
// span's parent or link, and the baggage of its work. The span is named
// after the route the mux matched ("POST /promotions"). Every span of the
// request's work, and of the events it writes, is in that trace.
func serverSpans(h http.Handler, edge apiPropagation) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if untracedPaths[r.URL.Path] {
			h.ServeHTTP(w, r)
			return
		}
		ctx, opts := edge.extract(r)
		ctx, span := httpTracer.Start(ctx, r.Method, append(opts, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method), semconv.URLPath(r.URL.Path),
				semconv.URLScheme(scheme(r)), semconv.UserAgentOriginal(r.UserAgent())))...)
		defer span.End()
		if c := r.Header.Get("X-Correlation-Id"); api.ValidCorrelationID(c) {
			span.SetAttributes(attribute.String("correlation_id", c))
		}
		if sc := span.SpanContext(); sc.IsValid() && sc.SpanID() != trace.SpanContextFromContext(r.Context()).SpanID() && span.IsRecording() {
			w.Header().Set(traceResponseHeader, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-"+sc.TraceFlags().String())
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		req := r.WithContext(ctx)
		h.ServeHTTP(sw, req)
		// The mux sets the pattern it matched on the request it was given.
		if route := req.Pattern; route != "" {
			method, path, ok := strings.Cut(route, " ")
			if !ok {
				method, path = r.Method, route
			}
			span.SetName(method + " " + path)
			span.SetAttributes(semconv.HTTPRoute(path))
		}
		span.SetAttributes(semconv.HTTPResponseStatusCode(sw.status))
		if sw.status >= http.StatusInternalServerError {
			span.SetStatus(codes.Error, http.StatusText(sw.status))
		}
	})
}

func scheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	return "http"
}

// statusWriter keeps the status an answer was written with.
type statusWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
}

func (w *statusWriter) WriteHeader(status int) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = status, true
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	w.wroteHeader = true
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
