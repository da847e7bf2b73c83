package middleware_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
)

func TestSpan_NestsAlongTheChainAndRecordsTheError(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
	boom := errors.New("boom")
	msg := newMessage(t)
	parent := msg.Context()

	_, err := chain(func(*message.Message) ([]*message.Message, error) { return nil, boom },
		middleware.Span("receive", trace.SpanKindConsumer), middleware.Span("process", trace.SpanKindInternal))(msg)

	require.ErrorIs(t, err, boom)
	require.Equal(t, parent, msg.Context(), "the message's context is restored for a retry")
	ended := spans.Ended()
	require.Len(t, ended, 2)
	process, receive := ended[0], ended[1]
	require.Equal(t, "process", process.Name())
	require.Equal(t, receive.SpanContext().SpanID(), process.Parent().SpanID(), "process is a child of receive")
	require.Equal(t, trace.SpanKindConsumer, receive.SpanKind())
	require.Equal(t, codes.Error, receive.Status().Code)
	var correlation string
	for _, a := range receive.Attributes() {
		if a.Key == "correlation_id" {
			correlation = a.Value.AsString()
		}
	}
	require.Equal(t, msg.Metadata.Get(event.HeaderCorrelationID), correlation)
}
