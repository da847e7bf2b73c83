package expire

import (
	"context"
	"time"

	"github.com/promoflow/promoflow/handlers/purchase"
)

// Wakeup brings the expirer's next cycle forward to the earliest upcoming
// EndsAt of an Active purchase, so that a purchase stops being Active within
// moments of its EndsAt whatever the interval. The ticker stays the heartbeat:
// its cycles retry what a woken cycle left (poison rows, rows locked
// elsewhere, a failed batch) and take purchases stored with an EndsAt that had
// already passed.
//
// It polls: every WakeupPoll it re-reads the earliest EndsAt, so a purchase
// created on any instance, by any path, re-arms it within WakeupPoll, for one
// index-only read a second per process. LISTEN/NOTIFY would re-arm at once but
// needs a dedicated connection per process and a re-read after every reconnect
// (notifications sent meanwhile are lost), and NOTIFY serialises the commits
// of every purchase write on one global lock. A paid purchase ends days after
// it is created, so a re-arm within a second costs no accuracy.
//
// Clock skew: a cycle compares EndsAt with AsOf, the database's clock
// (clock.go). Wakeup waits on that same clock: each read returns the earliest
// EndsAt with the database's now, and the process waits out their difference
// on its monotonic timer, never on its wall clock. An instance whose clock
// runs ahead or behind wakes neither before an EndsAt (to find nothing due,
// and then sleep past it) nor after it.
type Wakeup struct {
	exp *Expirer
	c   chan struct{}
}

// NewWakeup returns the wake-up of exp's cycles. Its Run does nothing when
// exp's Config has DisableWakeup.
func NewWakeup(exp *Expirer) *Wakeup {
	return &Wakeup{exp: exp, c: make(chan struct{}, 1)}
}

// C receives when an EndsAt has come. A signal not yet taken absorbs the
// next ones, so a long cycle is followed by one cycle, not by a queue of them.
func (w *Wakeup) C() <-chan struct{} { return w.c }

// Run arms and re-arms the wake-up until ctx ends.
func (w *Wakeup) Run(ctx context.Context) {
	if w.exp.cfg.DisableWakeup {
		return
	}
	poll := w.exp.cfg.WakeupPoll
	log := w.exp.log
	// What is due at start is the first tick's work; what a woken cycle leaves
	// due is the ticker's. Waking only for an EndsAt after the last wake (the
	// database's time of the start, then of each wake) keeps a poison row
	// from waking the expirer again and again.
	var after, armed time.Time
	failing := false
	timer := time.NewTimer(poll)
	defer timer.Stop()
	for {
		due, err := purchase.NextDueAfter(ctx, w.exp.db, after)
		wait := poll
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !failing {
				log.Warn("expire wake-up read failed; the ticker alone runs cycles until it recovers", "error", err.Error())
			}
			failing = true
		} else {
			failing = false
		}
		switch {
		case err != nil:
		case after.IsZero():
			after = due.Now
			continue
		case due.Found && !due.Now.Before(due.EndsAt):
			w.signal()
			// The cycle reads its AsOf later on the same clock, so it
			// covers every EndsAt up to now.
			after = due.Now
			continue
		case due.Found:
			if !due.EndsAt.Equal(armed) {
				armed = due.EndsAt
				log.Debug("expire wake-up armed", "EndsAt", due.EndsAt)
			}
			wait = min(wait, due.EndsAt.Sub(due.Now))
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
	}
}

// After brings the next cycle forward to now when res was cut by MaxDuration
// after expiring purchases: a burst's backlog is then taken by cycles back to
// back, each bounded by MaxDuration, with its own AsOf, run id and metrics,
// instead of one cycle per Interval (with the defaults, 30 s of work a
// minute). A cut cycle that expired nothing (due rows that are all poison or
// locked elsewhere) leaves the next cycle to the ticker.
func (w *Wakeup) After(res Result) {
	if res.Cut && res.ExpiredCount > 0 {
		w.signal()
	}
}

func (w *Wakeup) signal() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}
