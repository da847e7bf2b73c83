package rebuild_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/rebuild"
)

// reader reads the projection in a loop, as readers do while a rebuild runs:
// the cards alone (the storefront), or the cards and the replica in one
// statement. It keeps every view it read, in order.
type reader struct {
	mu    sync.Mutex
	views []view
	err   error
}

func (r *reader) reads() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.views)
}

// run reads until ctx ends; cardsOnly reads the cards alone.
func (r *reader) run(ctx context.Context, b *catalogtest.Bundle, cardsOnly bool) {
	for ctx.Err() == nil {
		v, err := readView(ctx, b, cardsOnly)
		r.mu.Lock()
		if err != nil && ctx.Err() == nil {
			r.err = err
		} else if err == nil {
			r.views = append(r.views, v)
		}
		r.mu.Unlock()
	}
}

// waitReads waits until r read twice more than it had at the call: a read
// that began after the call ended.
func (r *reader) waitReads(t *testing.T, what string) {
	t.Helper()
	from := r.reads()
	require.Eventually(t, func() bool { return r.reads() >= from+2 }, 30*time.Second, time.Millisecond,
		"no read answered while the rebuild was held at %s", what)
}

// TestRebuild_ReadersNeverSeeAPartialProjection: while a rebuild of a
// corrupted projection is held at each of its points in turn, readers read the
// cards and the replica in one statement; every view is the projection before
// the rebuild or the one after it, never a mix, and the storefront's card
// reads answer throughout, the switch included.
func TestRebuild_ReadersNeverSeeAPartialProjection(t *testing.T) {
	b, h, _, _ := corruptedAfterHistory(t)
	before, err := readView(t.Context(), b, false)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	var whole, storefront reader
	var wg sync.WaitGroup
	wg.Go(func() { whole.run(ctx, b, false) })
	wg.Go(func() { storefront.run(ctx, b, true) })
	defer func() { cancel(); wg.Wait() }()

	rb := newRebuilder(t, b)
	var held []rebuild.Point
	var heldReads int // views of whole read up to the end of the last hold before the commit
	rb.SetHook(func(_ context.Context, at rebuild.Point) error {
		held = append(held, at)
		if at == rebuild.PointSwitch {
			// The replica is locked for its rename: readers of the
			// replica wait for the commit; the card reads go on.
			storefront.waitReads(t, string(at))
			return nil
		}
		whole.waitReads(t, string(at))
		heldReads = whole.reads()
		return nil
	})
	st, err := rb.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, rebuild.StateDone, st.State)
	requireModel(t, b, h, "after the rebuild")
	after, err := readView(t.Context(), b, false)
	require.NoError(t, err)
	require.NotEqual(t, before, after, "the rebuild repaired the corruption")
	whole.waitReads(t, "the end")
	cancel()
	wg.Wait()

	require.NoError(t, whole.err)
	require.NoError(t, storefront.err)
	require.Subset(t, held, []rebuild.Point{rebuild.PointBeforeEnds, rebuild.PointEnds, rebuild.PointRead, rebuild.PointLoad,
		rebuild.PointCompute, rebuild.PointCatchUp, rebuild.PointSwitchLocked, rebuild.PointSwitch})
	switched := false
	for i, v := range whole.views {
		switch {
		case v == after:
			switched = true
		case v == before && !switched:
		case v == before:
			t.Fatalf("read %d: the projection before the rebuild, read after the one it built", i)
		default:
			t.Fatalf("read %d (reads before %d were made while the rebuild was held before its commit): a partial "+
				"projection: its cards are %s, its replica is %s", i, heldReads, which(v.Cards, before.Cards, after.Cards),
				which(v.Replica, before.Replica, after.Replica))
		}
		if i < heldReads {
			require.Equal(t, before, v, "read %d, while the rebuild was held before its commit: cards %s, replica %s", i,
				which(v.Cards, before.Cards, after.Cards), which(v.Replica, before.Replica, after.Replica))
		}
	}
	require.True(t, switched)
	for i, v := range storefront.views {
		require.Contains(t, []string{before.Cards, after.Cards}, v.Cards, "card read %d", i)
	}
}

// which names the projection that half of a view is from.
func which(have, before, after string) string {
	switch have {
	case before:
		return "those before the rebuild"
	case after:
		return "those after the rebuild"
	}
	return "those of neither"
}
