package status

import (
	"context"
	"time"

	"github.com/promoflow/promoflow/handlers/outbox"
)

// Outbox is the relay's part.
type Outbox struct {
	Health
	// Backlog events wait to be relayed; the oldest for OldestAgeSeconds.
	Backlog          int64   `json:"backlog"`
	OldestAgeSeconds float64 `json:"oldestAgeSeconds"`
	// Relay are the relay's sessions in a position transaction, the holder
	// first: none while the relay is idle between polls.
	Relay []RelaySession `json:"relay"`
	// HeldBackBy is the oldest outbox writer in progress, which the relay
	// reads no later transaction past; nil when none runs.
	HeldBackBy *Writer `json:"heldBackBy"`
	lag        time.Duration
}

// RelaySession is a database session of a relay.
type RelaySession struct {
	outbox.RelaySession
	SinceSeconds float64 `json:"sinceSeconds"`
}

// Writer is an outbox writer in progress.
type Writer struct {
	outbox.Writer
	AgeSeconds float64 `json:"ageSeconds"`
}

func (r *Reader) outbox(ctx context.Context) (s Outbox) {
	stats, err := outbox.ReadStats(ctx, r.cfg.DB)
	if err != nil {
		s.failed(err)
		return s
	}
	s.Backlog, s.OldestAgeSeconds, s.lag = stats.Backlog, seconds(stats.Lag), stats.Lag
	// A cutover's freeze is planned: a note, not a problem
	// (PromotionDatabaseRefusesWrites pages if it is left for long).
	if f, frozen, err := outbox.ReadFreeze(ctx, r.cfg.DB); err == nil && frozen {
		s.note("writes are frozen since %s (set by %s): the purchase API answers 503 and the expirer pauses; `promoflow outbox thaw` lifts it",
			f.At.UTC().Format(time.RFC3339), f.By)
	}
	sessions, err := outbox.RelaySessions(ctx, r.cfg.DB)
	if err != nil {
		s.failed(err)
		return s
	}
	s.Relay = make([]RelaySession, len(sessions))
	for i, rs := range sessions {
		s.Relay[i] = RelaySession{RelaySession: rs, SinceSeconds: seconds(rs.Since)}
	}
	w, held, err := outbox.OldestWriter(ctx, r.cfg.DB)
	if err != nil {
		s.failed(err)
		return s
	}
	if held {
		s.HeldBackBy = &Writer{Writer: w, AgeSeconds: seconds(w.Age)}
	}
	s.judge(r.cfg.Limits)
	return s
}

// judge mirrors PromotionOutboxBacklogHigh and PromotionOutboxRelayHeldBack,
// and holds the outbox's oldest event to the lag SLO.
func (s *Outbox) judge(l Limits) {
	if s.Backlog > int64(l.OutboxBacklog) {
		s.problem("PromotionOutboxBacklogHigh", "%d events wait in the outbox (limit %d)", s.Backlog, l.OutboxBacklog)
	}
	if s.lag > l.OutboxLag {
		s.problem("", "the oldest outbox event waits for %s (limit %s): the relay does not drain the outbox",
			s.lag.Round(time.Second), l.OutboxLag)
	}
	if w := s.HeldBackBy; w != nil && w.Age > l.HeldBack {
		s.problem("PromotionOutboxRelayHeldBack", "outbox writer pid %d (application %q, %s) has run for %s (limit %s) and holds every later event back",
			w.PID, w.Application, w.State, w.Age.Round(time.Second), l.HeldBack)
	}
}
