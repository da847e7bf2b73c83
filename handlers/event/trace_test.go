package event_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/promoflow/promoflow/handlers/event"
)

// TestOrigins_EachEventHasItsWritersContext: neighbours with the same
// headers, a different writer, tracestate alone telling two apart, and an
// event without any.
func TestOrigins_EachEventHasItsWritersContext(t *testing.T) {
	before := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(before) })
	const a, b = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	msgs := []*message.Message{
		traced(a, ""), traced(a, ""), traced(b, ""), traced(b, "k=v"), traced("", ""), traced(a, ""),
	}
	got := event.Origins(msgs)
	require.Len(t, got, len(msgs))
	for i, want := range []struct{ span, state string }{
		{"b7ad6b7169203331", ""}, {"b7ad6b7169203331", ""}, {"00f067aa0ba902b7", ""}, {"00f067aa0ba902b7", "k=v"}, {"", ""}, {"b7ad6b7169203331", ""},
	} {
		if want.span == "" {
			require.False(t, got[i].IsValid(), "event %d has no origin", i)
			continue
		}
		require.True(t, got[i].IsRemote(), "event %d", i)
		require.Equal(t, want.span, got[i].SpanID().String(), "event %d", i)
		require.Equal(t, want.state, got[i].TraceState().String(), "event %d", i)
	}
}

func traced(parent, state string) *message.Message {
	msg := message.NewMessage("m", nil)
	if parent != "" {
		msg.Metadata.Set("traceparent", parent)
	}
	if state != "" {
		msg.Metadata.Set("tracestate", state)
	}
	return msg
}
