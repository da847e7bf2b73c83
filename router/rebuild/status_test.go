package rebuild_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/rebuild"
)

// TestRebuild_StatusNamesEachPhase holds a rebuild at each of its points: its
// own status, its live counts (the progress bar and log) and the status that
// another process reads from the database (rebuild --status, the admin
// endpoint of another catalog process) name the phase it is in.
func TestRebuild_StatusNamesEachPhase(t *testing.T) {
	b := setup(t)
	projects, objects := cards(t, b)
	b.Start(t)
	produceHistory(t, b, &history{}, projects, objects, 4)
	cfg := rebuild.Config{StatusEvery: 20 * time.Millisecond}
	rb, other := newRebuilderWith(t, b, cfg), newRebuilderWith(t, b, cfg)
	want := map[rebuild.Point]rebuild.Phase{
		rebuild.PointBeforeEnds: rebuild.PhaseRead, rebuild.PointEnds: rebuild.PhaseRead, rebuild.PointRead: rebuild.PhaseRead,
		rebuild.PointLoad: rebuild.PhaseLoad, rebuild.PointCompute: rebuild.PhaseCompute, rebuild.PointCatchUp: rebuild.PhaseCatchUp,
		rebuild.PointSwitchLocked: rebuild.PhaseSwitch, rebuild.PointSwitch: rebuild.PhaseSwitch,
	}
	seen := map[rebuild.Point]bool{}
	rb.SetHook(func(ctx context.Context, at rebuild.Point) error {
		seen[at] = true
		st, err := rb.Status(ctx)
		require.NoError(t, err)
		require.Equal(t, want[at], st.Phase, "at %s: the rebuild's status", at)
		live, ok := rb.Live()
		require.True(t, ok)
		require.Equal(t, string(want[at]), live.Phase, "at %s: the progress bar's counts", at)
		require.Eventually(t, func() bool {
			st, err := other.Status(ctx)
			return err == nil && st.State == rebuild.StateRunning && st.Phase == want[at]
		}, 30*time.Second, 10*time.Millisecond, "at %s: another process reads the phase %s", at, want[at])
		return nil
	})
	st, err := rb.Run(context.Background())
	require.NoError(t, err)
	require.Len(t, seen, len(want))
	require.Equal(t, rebuild.StateDone, st.State)
	require.Equal(t, rebuild.PhaseSwitch, st.Phase, "a finished rebuild names the last phase it began")
}
