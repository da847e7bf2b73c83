package rebuild_test

import (
	"context"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/logtest"
	"github.com/promoflow/promoflow/handlers/nettest"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/rebuild"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// cutOffMargin is how much past the switch's idle timeout the consumer may
// stall once the rebuild is cut off from PostgreSQL mid-switch: the server
// ends the switch's session (and its locks) once it paused that long, and
// the consumer's waiting batch then commits.
const cutOffMargin = 2 * time.Second

// TestRebuild_SwitchCutOffFromPostgresReleasesItsLocks: the rebuild reaches
// PostgreSQL through a TCP proxy, which opens a black hole (nothing crosses,
// nothing is closed, as on a network partition) once the switch holds the
// projection's writers back. An event sent then is applied by the consumer
// (which reaches PostgreSQL directly) within the switch's idle timeout and
// the margin: the server ended the switch's session, which it would
// otherwise keep, with its locks, until TCP keepalive noticed. Once the hole
// heals, the switch finds its session ended, gives way, catches up and
// switches: the projection is the model of every event sent.
// The stall it measured (3.0 s, with the default idle timeout of 3 s) is the
// runbook's.
func TestRebuild_SwitchCutOffFromPostgresReleasesItsLocks(t *testing.T) {
	b, h, projects, _ := corruptedAfterHistory(t)
	u, err := url.Parse(b.URL)
	require.NoError(t, err)
	proxy, err := nettest.NewProxy("127.0.0.1:0", u.Host)
	require.NoError(t, err)
	u.Host = proxy.Addr()
	var logs logtest.Logs
	rb, err := rebuild.New(rebuild.Config{DB: pgtest.Open(t, u.String()), Kafka: b.Cfg.Kafka, Topic: b.Cfg.Topic,
		Log: logs.Logger()})
	require.NoError(t, err)
	t.Cleanup(rb.Stop)
	t.Cleanup(proxy.Close) // first: a rebuild stuck in the hole then ends
	cut := make(chan time.Time, 1)
	holed := false
	rb.SetHook(func(_ context.Context, at rebuild.Point) error {
		if at == rebuild.PointSwitchLocked && !holed { // the first switch
			holed = true
			proxy.BlackHole()
			cut <- time.Now()
		}
		return nil
	})
	done := runAsync(rb)

	var cutAt time.Time
	select {
	case cutAt = <-cut:
	case r := <-done:
		t.Fatalf("the rebuild ended before its switch: %+v, %v", r.st, r.err)
	}
	before := b.BoostOf(event.TargetProject, projects[1])
	ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 9, catalogtest.Target(event.TargetProject, projects[1]))
	h.produce(t, b, ev)
	bound := rebuild.SwitchIdleTimeoutDefault + cutOffMargin
	require.Eventually(t, func() bool { return b.BoostOf(event.TargetProject, projects[1]) == before+9 },
		bound, 10*time.Millisecond, "the consumer did not apply an event within %s of the rebuild's cut-off mid-switch: "+
			"the switch's session still holds the projection's locks on the server", bound)
	stall := time.Since(cutAt)
	t.Logf("the consumer applied again %s after the cut (bound %s)", stall.Round(10*time.Millisecond), bound)

	proxy.Heal() // the partition ends: the switch finds its session ended, gives way, and switches again
	var r runResult
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the rebuild did not end within a minute of the heal")
	}
	require.NoError(t, r.err)
	require.Equal(t, rebuild.StateDone, r.st.State)
	gave := logs.Find(slog.LevelWarn, "the switch gave way; the projection's writers go on, and the switch tries again once it caught up")
	require.NotEmpty(t, gave, "the switch whose session PostgreSQL ended gave way")
	require.Contains(t, gave[0]["reason"], "paused longer than the switch idle timeout")
	b.WaitConsumed(t, float64(h.sent()), 30*time.Second)
	requireModel(t, b, h, "after a switch cut off from PostgreSQL, then healed")
}
