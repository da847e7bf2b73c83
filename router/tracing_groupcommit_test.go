package router_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/catalogtest"
)

// TestTracing_GroupCommitLinksEveryEvent: events of many traces, waiting on
// three partitions for one worker, share transactions; each event's receive
// span continues its own trace, and the store span of a transaction of
// several events links to the process span of each, of every trace it
// applies (a transaction of one continues its event's trace).
func TestTracing_GroupCommitLinksEveryEvent(t *testing.T) {
	c := setupCatalog(t, true)
	c.Cfg.Workers = 1 // the events that arrive while a transaction runs wait together for the next
	const n = 30
	msgs := make([]*message.Message, n)
	origins := make([]trace.SpanContext, n)
	for i := range msgs {
		ctx, origin := originSpan("test.purchase.create")
		ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetProject, uuid.New()))
		msg, err := event.NewMessage(ev, fmt.Sprintf("group-commit-%d", i), time.Now())
		require.NoError(t, err)
		event.InjectTrace(ctx, msg)
		msgs[i], origins[i] = msg, origin
	}
	require.NoError(t, c.Pub.Publish(c.Cfg.Topic, msgs...))
	c.Start(t)
	c.WaitConsumed(t, n, 30*time.Second)

	processes := map[trace.SpanID]trace.SpanContext{}
	for i, msg := range msgs {
		receive := waitSpan(t, "catalog.promotion.receive", "messaging.message.id", msg.UUID)
		require.True(t, childOf(receive, origins[i]), "event %d: receive continues its writer's trace", i)
		process := requireConsumed(t, receive)
		processes[process.SpanContext().SpanID()] = process.SpanContext()
	}
	var shared []sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() != "catalog.promotion.store" || len(s.Links()) < 2 {
			continue
		}
		if _, ours := processes[s.Links()[0].SpanContext.SpanID()]; ours {
			shared = append(shared, s)
		}
	}
	require.NotEmpty(t, shared, "some transaction applied several of the events")
	for _, s := range shared {
		require.False(t, s.Parent().IsValid(), "a transaction of several traces is a root")
		require.Equal(t, fmt.Sprint(len(s.Links())), attr(s, "messaging.batch.message_count"), "one link per event")
		for _, l := range s.Links() {
			process, ours := processes[l.SpanContext.SpanID()]
			require.True(t, ours, "the transaction links to process spans of the events only")
			require.Equal(t, process.TraceID(), l.SpanContext.TraceID())
		}
	}
	t.Logf("%d transactions of several events, the largest of %d", len(shared), maxLinks(shared))
}

func maxLinks(ss []sdktrace.ReadOnlySpan) int {
	n := 0
	for _, s := range ss {
		n = max(n, len(s.Links()))
	}
	return n
}
