package rebuild_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/rebuild"
)

// TestRebuild_SwitchGivesWayToALongReaderOfTheReplica: a session holds the
// live replica in an open transaction, as an audit does for as long as it
// runs, while a rebuild of a corrupted projection reaches its switch. The
// switch holds the projection's writers back while it waits for the replica,
// so it gives way after its switch wait and tries again, instead of stalling
// the consumer for as long as the reader runs: the consumer applies events
// sent while the reader still holds the replica. Once the reader ends, the
// switch goes through and the projection is the model of every event sent.
func TestRebuild_SwitchGivesWayToALongReaderOfTheReplica(t *testing.T) {
	b, h, projects, objects := corruptedAfterHistory(t)

	reader, err := b.DB.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	defer reader.Rollback() //nolint:errcheck // ended below
	var n int
	require.NoError(t, reader.Get(&n, `SELECT count(*) FROM catalog.promotion_contributions`))

	rb := newRebuilderWith(t, b, rebuild.Config{SwitchWait: 200 * time.Millisecond})
	attempts := make(chan struct{}, 1000)
	rb.SetHook(func(_ context.Context, at rebuild.Point) error {
		if at == rebuild.PointSwitchLocked {
			attempts <- struct{}{}
		}
		return nil
	})
	type result struct {
		st  rebuild.Status
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := rb.Run(context.Background())
		done <- result{st, err}
	}()

	for i := range 2 {
		select {
		case <-attempts:
		case r := <-done:
			t.Fatalf("the rebuild ended while a reader held the replica: %+v, %v", r.st, r.err)
		case <-time.After(30 * time.Second):
			t.Fatalf("the switch made %d attempt(s) in 30s: it waits for the reader of the replica, "+
				"holding the projection's writers back for as long as the reader runs", i)
		}
	}
	windowEvents(t, b, h, projects[0], objects[0], 77)
	b.WaitConsumed(t, float64(h.sent()), 30*time.Second) // the switch let the consumer through
	select {
	case r := <-done:
		t.Fatalf("the rebuild switched while a reader held the replica: %+v, %v", r.st, r.err)
	default:
	}

	require.NoError(t, reader.Rollback())
	var r result
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the rebuild did not switch within 60s of the reader's end")
	}
	require.NoError(t, r.err)
	require.Equal(t, rebuild.StateDone, r.st.State)
	b.WaitConsumed(t, float64(h.sent()), 30*time.Second)
	requireModel(t, b, h, "after a switch that gave way to a reader of the replica")
}
