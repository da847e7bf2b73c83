package status

import (
	"context"
	"time"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/router/rebuild"
)

// Projection is the PromotionBoost projection's part: the drift its last
// card check found, and the newest rebuild.
type Projection struct {
	Health
	// CardCheck is nil when no check was ever recorded.
	CardCheck *CardCheck     `json:"cardCheck"`
	Rebuild   rebuild.Status `json:"rebuild"`
}

// CardCheck is the newest check of every card's boost against the replica.
type CardCheck struct {
	boost.CardCheck
	AgeSeconds float64 `json:"ageSeconds"`
}

func (r *Reader) projection(ctx context.Context) (s Projection) {
	check, found, err := boost.ReadCardCheck(ctx, r.cfg.DB)
	if err != nil {
		s.failed(err)
		return s
	}
	if found {
		s.CardCheck = &CardCheck{CardCheck: check, AgeSeconds: seconds(check.Age)}
	}
	if s.Rebuild, err = r.rebuilder.Status(ctx); err != nil {
		s.failed(err)
		return s
	}
	s.judge()
	return s
}

// judge mirrors CatalogPromotionDrift; a rebuild that failed or runs is a note.
func (s *Projection) judge() {
	switch c := s.CardCheck; {
	case c == nil:
		s.note("no card check recorded yet: a catalog process checks every CATALOG_AUDIT_INTERVAL (5m), or run promoflow audit")
	case c.Drifted > 0:
		s.problem("CatalogPromotionDrift", "%d of %d cards drifted from the replica at the check %s ago (%s); promoflow audit --repair fixes them",
			c.Drifted, c.Checked, c.Age.Round(time.Second), c.Source)
	}
	switch s.Rebuild.State {
	case rebuild.StateFailed:
		s.note("the newest rebuild failed in phase %s: %s (the live projection is as it was)", s.Rebuild.Phase, s.Rebuild.Error)
	case rebuild.StateRunning:
		s.note("a rebuild runs: phase %s, %d of %d offsets", s.Rebuild.Phase, s.Rebuild.OffsetsDone, s.Rebuild.OffsetsTotal)
	}
}
