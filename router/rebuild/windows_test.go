package rebuild_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/rebuild"
)

// windowEvents sends, for one window of a rebuild: a new purchase on a
// project and one of its objects, the removal of the oldest purchase still
// active, and a stale snapshot of that purchase.
func windowEvents(t *testing.T, b *catalogtest.Bundle, h *history, project, object uuid.UUID, weight int) {
	t.Helper()
	h.produce(t, b, catalogtest.PurchaseEvent(event.StatusActive, 1, weight, catalogtest.Target(event.TargetProject, project),
		catalogtest.Target(event.TargetPropertyObject, object)))
	var active *event.PurchaseChanged
	for _, ev := range h.latest() {
		if ev.Status == event.StatusActive && (active == nil || ev.BoostWeight < active.BoostWeight) {
			active = &ev
		}
	}
	require.NotNil(t, active)
	stale := *active
	removed := *active
	removed.Status, removed.Version = event.StatusCancelled, active.Version+1
	h.produce(t, b, removed)
	h.produce(t, b, stale)
}

// TestRebuild_EventsInEveryWindowAreKept sends live events in every window of
// a rebuild of a corrupted projection, through its test seam: before it
// records the ends, during the bulk read and load, during the catch-up
// (applied by the consumer past the catch-up's ends), and during the switch
// (once it holds the writers back, and once the new replica is in place). The
// consumer applies those it can before the rebuild goes on. Once both are
// done, the projection is the model of every event sent.
func TestRebuild_EventsInEveryWindowAreKept(t *testing.T) {
	b, h, projects, objects := corruptedAfterHistory(t)

	rb := newRebuilder(t, b)
	var mu sync.Mutex
	sent := map[rebuild.Point]bool{}
	rb.SetHook(func(_ context.Context, at rebuild.Point) error {
		mu.Lock()
		defer mu.Unlock()
		if sent[at] {
			return nil // a later catch-up round
		}
		sent[at] = true
		windowEvents(t, b, h, projects[len(sent)%2], objects[len(sent)%4], 50+len(sent))
		switch at {
		case rebuild.PointSwitchLocked, rebuild.PointSwitch:
			// The consumer waits for the switch: it applies these after it.
		default:
			b.WaitConsumed(t, float64(h.sent()), 30*time.Second) // the live projection holds them
		}
		return nil
	})
	st, err := rb.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, rebuild.StateDone, st.State)
	require.Equal(t, map[rebuild.Point]bool{rebuild.PointBeforeEnds: true, rebuild.PointEnds: true, rebuild.PointRead: true,
		rebuild.PointLoad: true, rebuild.PointCompute: true, rebuild.PointCatchUp: true, rebuild.PointSwitchLocked: true,
		rebuild.PointSwitch: true}, sent, "events were sent in every window")
	b.WaitConsumed(t, float64(h.sent()), 30*time.Second)
	requireModel(t, b, h, "after the rebuild and the events of every window")
}
