package expire_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
)

// runWakeup runs w until the test ends.
func runWakeup(t *testing.T, w *expire.Wakeup) <-chan struct{} {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return done
}

// TestWakeup_SignalsAtEachEndsAtOnTheDatabasesClock: the process's clock is
// an hour ahead of PostgreSQL's, and the wake-up follows PostgreSQL's, which
// AsOf uses: a purchase that ends in half an hour does not wake it, and each
// signal comes once the database's clock reached the EndsAt. A purchase it
// woke for and that no cycle expired does not wake it again: the second
// signal waits for the second EndsAt.
func TestWakeup_SignalsAtEachEndsAtOnTheDatabasesClock(t *testing.T) {
	b := setup(t, expire.Config{WakeupPoll: 50 * time.Millisecond})
	b.exp.Now = func() time.Time { return time.Now().Add(time.Hour) }
	start := databaseNow(t, b.db)
	purchasetest.SeedActive(t, b.db, 1, start.Add(-time.Minute))   // due at start: the first tick's
	purchasetest.SeedActive(t, b.db, 1, start.Add(30*time.Minute)) // due by the process's clock only
	first := start.Add(300 * time.Millisecond)
	second := first.Add(300 * time.Millisecond)
	purchasetest.SeedActive(t, b.db, 2, first)
	purchasetest.SeedActive(t, b.db, 1, second)
	w := expire.NewWakeup(b.exp)
	runWakeup(t, w)

	for _, endsAt := range []time.Time{first, second} {
		select {
		case <-w.C():
			now := databaseNow(t, b.db)
			require.False(t, now.Before(endsAt), "woke at %s, before EndsAt %s by the database's clock", now, endsAt)
		case <-time.After(10 * time.Second):
			t.Fatalf("no wake-up for EndsAt %s", endsAt)
		}
	}
}

func TestWakeup_DisabledLeavesCyclesToTheTicker(t *testing.T) {
	b := setup(t, expire.Config{DisableWakeup: true})
	purchasetest.SeedActive(t, b.db, 1, time.Now().Add(100*time.Millisecond))
	w := expire.NewWakeup(b.exp)
	done := runWakeup(t, w)
	require.Eventually(t, func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}, 10*time.Second, time.Millisecond, "Run returns at once")
	require.Empty(t, w.C())
}

// TestWakeup_ACutCycleThatExpiredBringsTheNextForward: a cycle cut by
// MaxDuration after expiring purchases signals the next at once; one that
// drained, or that expired nothing (its due rows all poison or locked
// elsewhere), leaves the next to the ticker.
func TestWakeup_ACutCycleThatExpiredBringsTheNextForward(t *testing.T) {
	exp, err := expire.New(nil, expire.Config{}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	w := expire.NewWakeup(exp)
	for _, res := range []expire.Result{{ExpiredCount: 200}, {Cut: true}, {Cut: true, PoisonCount: 200}} {
		w.After(res)
		require.Empty(t, w.C(), "no signal after %+v", res)
	}
	w.After(expire.Result{Cut: true, ExpiredCount: 1})
	require.Len(t, w.C(), 1, "the next cycle is due at once")
}
