package rebuild_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/logtest"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/rebuild"
)

// TestRebuild_SwitchGivesWayWhenTheTailIsLong: 12 purchases arrive while the
// switch holds the projection's writers back, more than the 5 records it may
// fold in under its locks (SwitchMaxRecords), and the catch-ups are used up.
// The switch gives way instead of folding them while the consumer waits: it
// rolls back, logs why, and the consumer applies them; the rebuild catches
// up, and its next switch has nothing left to fold. The projection is the
// model of every event sent.
func TestRebuild_SwitchGivesWayWhenTheTailIsLong(t *testing.T) {
	b, h, projects, _ := corruptedAfterHistory(t)
	var logs logtest.Logs
	rb := newRebuilderWith(t, b, rebuild.Config{SwitchRecords: 1, SwitchMaxRecords: 5, CatchUps: 1, Log: logs.Logger()})
	attempts := 0
	rb.SetHook(func(_ context.Context, at rebuild.Point) error {
		if at != rebuild.PointSwitchLocked {
			return nil
		}
		attempts++
		if attempts == 1 {
			for i := range 12 {
				h.produce(t, b, catalogtest.PurchaseEvent(event.StatusActive, 1, 20+i, catalogtest.Target(event.TargetProject, projects[i%2])))
			}
		}
		return nil
	})

	st, err := rb.Run(context.Background())

	require.NoError(t, err)
	require.Equal(t, rebuild.StateDone, st.State)
	require.GreaterOrEqual(t, attempts, 2, "the switch folded the 12 records that arrived under its locks, more than "+
		"the 5 it may, instead of giving way")
	gave := logs.Find(slog.LevelWarn, "the switch gave way; the projection's writers go on, and the switch tries again once it caught up")
	require.NotEmpty(t, gave)
	require.Contains(t, gave[0]["reason"], "12 records arrived since the last catch-up, more than the 5")
	b.WaitConsumed(t, float64(h.sent()), 30*time.Second)
	requireModel(t, b, h, "after a switch that gave way to a long tail")
}
