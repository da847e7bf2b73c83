package expire_test

import (
	"context"
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

// TestWakeup_SignalsAtEachEndsAtOnTheExpirersClock: the process's clock is an
// hour ahead of PostgreSQL's, and the wake-up follows the process's, which
// AsOf uses. A purchase it woke for and that no cycle expired does not wake
// it again: the second signal waits for the second EndsAt.
func TestWakeup_SignalsAtEachEndsAtOnTheExpirersClock(t *testing.T) {
	b := setup(t, expire.Config{WakeupPoll: 50 * time.Millisecond})
	const skew = time.Hour
	b.exp.Now = func() time.Time { return time.Now().Add(skew) }
	purchasetest.SeedActive(t, b.db, 1, time.Now().Add(skew-time.Minute)) // due at start: the first tick's
	first := time.Now().Add(skew + 300*time.Millisecond).Truncate(time.Microsecond)
	second := first.Add(300 * time.Millisecond)
	purchasetest.SeedActive(t, b.db, 2, first)
	purchasetest.SeedActive(t, b.db, 1, second)
	w := expire.NewWakeup(b.exp)
	runWakeup(t, w)

	for _, endsAt := range []time.Time{first, second} {
		select {
		case <-w.C():
			require.False(t, b.exp.Now().Before(endsAt), "woke before EndsAt %s", endsAt)
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
