package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// apiPropagation is what the public API takes from a caller's trace
// headers. Whatever a request's context holds is injected into the Kafka
// headers of the events it writes, so a caller's traceparent and baggage
// would otherwise be published verbatim: kilobytes of someone else's
// key/values on every record, and a trace id chosen by whoever calls.
type apiPropagation struct {
	// BaggageAllow are the baggage keys kept from a request, comma-separated
	// (API_BAGGAGE_ALLOW). Defaults to none: all baggage is dropped.
	BaggageAllow string
	// TraceParentTrusted makes a caller's traceparent the parent of the
	// request's server span (API_TRACE_PARENT_TRUSTED). Defaults to false:
	// the server span is a new root that links to it.
	TraceParentTrusted bool
}

func (p *apiPropagation) register(s *settings) {
	s.str(&p.BaggageAllow, "api-baggage-allow", "API_BAGGAGE_ALLOW", "",
		"baggage keys kept from an API request and published with its events, comma-separated; any other baggage is dropped")
	s.bool(&p.TraceParentTrusted, "api-trace-parent-trusted", "API_TRACE_PARENT_TRUSTED", false,
		"make an API caller's traceparent the parent of the request's trace (only behind callers you trust); otherwise the request starts a new trace linked to it")
}

// baggageKey is a W3C Baggage key: an HTTP token (RFC 9110).
var baggageKey = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

func (p apiPropagation) validate() error {
	var errs []error
	for _, key := range p.allowedKeys() {
		if !baggageKey.MatchString(key) {
			errs = append(errs, fmt.Errorf("API_BAGGAGE_ALLOW (--api-baggage-allow): %q is not a baggage key (W3C Baggage: a token, no spaces or separators); give keys separated by commas", key))
		}
	}
	return errors.Join(errs...)
}

// allowedKeys are the keys of BaggageAllow, without blanks.
func (p apiPropagation) allowedKeys() []string {
	var keys []string
	for key := range strings.SplitSeq(p.BaggageAllow, ",") {
		if key = strings.TrimSpace(key); key != "" {
			keys = append(keys, key)
		}
	}
	return keys
}

// extract is r's context with the baggage members BaggageAllow names, and
// the options that start the server span: a child of the caller's span
// when it is trusted, else a new root with a link to it, so that the
// caller's trace is still found from ours.
func (p apiPropagation) extract(r *http.Request) (context.Context, []trace.SpanStartOption) {
	in := otel.GetTextMapPropagator().Extract(context.Background(), propagation.HeaderCarrier(r.Header))
	ctx := r.Context()
	var kept []baggage.Member
	if bag := baggage.FromContext(in); bag.Len() > 0 {
		for _, key := range p.allowedKeys() {
			if m := bag.Member(key); m.Key() != "" {
				kept = append(kept, m)
			}
		}
	}
	if bag, err := baggage.New(kept...); err == nil && bag.Len() > 0 {
		ctx = baggage.ContextWithBaggage(ctx, bag)
	}
	caller := trace.SpanContextFromContext(in)
	switch {
	case !caller.IsValid():
		return ctx, nil
	case p.TraceParentTrusted:
		return trace.ContextWithRemoteSpanContext(ctx, caller), nil
	default:
		return ctx, []trace.SpanStartOption{trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: caller})}
	}
}
