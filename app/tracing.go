package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/middleware/otlpexport"
)

// setupTracing sets the process's propagator from $OTEL_PROPAGATORS, so that
// trace context travels through it whether or not it exports, and exports
// spans over OTLP/HTTP (otlpexport) when $OTEL_EXPORTER_OTLP_ENDPOINT or
// $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (the exporter and the SDK read
// the other OTEL_* variables themselves, the sampler included). Without them
// spans are dropped at no cost. The returned func flushes and stops the
// exporter.
func setupTracing(ctx context.Context, service string) (func(context.Context) error, error) {
	otel.SetTextMapPropagator(propagatorFromEnv(os.Getenv("OTEL_PROPAGATORS")))
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlpexport.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("trace exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithRawSpanLimits(spanLimits()),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "promoflow-"+service))))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// relayLinkLimit is the most links a span keeps unless
// $OTEL_SPAN_LINK_COUNT_LIMIT says otherwise: one Kafka request of the relay
// links to the origin of each event it carries, up to a merged message's
// events, where the SDK's default (128) would drop some.
const relayLinkLimit = outbox.MaxEventsPerRelay + outbox.MergeRowsBelow

// spanLimits are the SDK's limits from the OTEL_SPAN_* variables, with
// room for the relay's links.
func spanLimits() sdktrace.SpanLimits {
	limits := sdktrace.NewSpanLimits()
	if os.Getenv("OTEL_SPAN_LINK_COUNT_LIMIT") == "" {
		limits.LinkCountLimit = relayLinkLimit
	}
	return limits
}

// propagatorFromEnv is the propagator $OTEL_PROPAGATORS names, as the
// OpenTelemetry SDK configuration defines it: a comma-separated list, by
// default "tracecontext,baggage"; "none" propagates nothing. A name it does
// not know is reported through the OpenTelemetry error handler and ignored.
func propagatorFromEnv(value string) propagation.TextMapPropagator {
	if strings.TrimSpace(value) == "" {
		value = "tracecontext,baggage"
	}
	var props []propagation.TextMapPropagator
	for name := range strings.SplitSeq(value, ",") {
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "tracecontext":
			props = append(props, propagation.TraceContext{})
		case "baggage":
			props = append(props, propagation.Baggage{})
		case "none":
			return propagation.NewCompositeTextMapPropagator()
		case "":
		default:
			otel.Handle(fmt.Errorf("OTEL_PROPAGATORS: propagator %q is not supported and is ignored (supported: tracecontext, baggage, none)", name))
		}
	}
	return propagation.NewCompositeTextMapPropagator(props...)
}
