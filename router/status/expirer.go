package status

import (
	"context"
	"time"

	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/purchase"
)

// Expirer is the expirer's part: its last cycle and what is due now.
type Expirer struct {
	Health
	// LastCycle is nil when no cycle was ever recorded.
	LastCycle *Cycle `json:"lastCycle"`
	// Due are the Active purchases past their EndsAt.
	Due Due `json:"due"`
}

// Cycle is the newest cycle of any promotion process.
type Cycle struct {
	expire.LastCycle
	IntervalSeconds float64 `json:"intervalSeconds"`
	AgeSeconds      float64 `json:"ageSeconds"`
	// LastOKAgeSeconds is how long ago the newest cycle that did not fail
	// ended; nil when none did.
	LastOKAgeSeconds *float64 `json:"lastOkAgeSeconds"`
}

// Due is the backlog and the purchase that has waited longest.
type Due struct {
	purchase.Due
	OldestAgeSeconds float64 `json:"oldestAgeSeconds"`
}

func (r *Reader) expirer(ctx context.Context) (s Expirer) {
	due, err := purchase.ReadDue(ctx, r.cfg.DB)
	if err != nil {
		s.failed(err)
		return s
	}
	s.Due = Due{Due: due, OldestAgeSeconds: seconds(due.OldestAge)}
	last, found, err := expire.ReadLastCycle(ctx, r.cfg.DB)
	if err != nil {
		s.failed(err)
		return s
	}
	if found {
		c := Cycle{LastCycle: last, IntervalSeconds: seconds(last.Interval), AgeSeconds: seconds(last.Age)}
		if last.OKAge >= 0 {
			ok := seconds(last.OKAge)
			c.LastOKAgeSeconds = &ok
		}
		s.LastCycle = &c
	}
	s.judge(r.cfg.Limits)
	return s
}

// judge mirrors PromotionExpireJobStalled (no good cycle for two intervals)
// and PromotionExpireBacklogHigh.
func (s *Expirer) judge(l Limits) {
	switch c := s.LastCycle; {
	case c == nil:
		s.problem("PromotionExpireJobStalled", "no expirer cycle was ever recorded: no promotion process has run one")
	case c.OKAge < 0:
		s.problem("PromotionExpireJobStalled", "no expirer cycle has succeeded yet; the last one failed: %s", c.Error)
	case c.OKAge > 2*c.Interval:
		s.problem("PromotionExpireJobStalled", "the last good expirer cycle ended %s ago, over two intervals (%s)",
			c.OKAge.Round(time.Second), 2*c.Interval)
	case c.Error != "":
		s.note("the last expirer cycle failed (the next one retries): %s", c.Error)
	}
	if s.Due.Count > l.ExpireBacklog {
		s.problem("PromotionExpireBacklogHigh", "%d due purchases are still Active (limit %d); the oldest, %s, ended %s ago",
			s.Due.Count, l.ExpireBacklog, s.Due.Oldest, s.Due.OldestAge.Round(time.Second))
	}
	if c := s.LastCycle; c != nil && c.PoisonCount > 0 {
		s.note("%d poison purchases stay Active (their ERROR log names them; docs/runbooks/expire-promotions.md)", c.PoisonCount)
	}
}
