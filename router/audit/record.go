package audit

import (
	"context"

	"github.com/promoflow/promoflow/handlers/boost"
)

// Sources of a recorded card check.
const (
	SourceCatalog = "catalog" // the catalog's periodic audit
	SourceCommand = "audit"   // promoflow audit
)

// Record writes r as the newest card check (boost.CardCheck): the drift it
// left, after any repair.
func (a *Auditor) Record(ctx context.Context, r CardsReport, source string) error {
	c := boost.CardCheck{Checked: r.Checked, Drifted: r.Drifted - r.Repaired, Source: source}
	if c.Drifted > 0 {
		c.Samples = r.Samples
	}
	return boost.RecordCardCheck(ctx, a.cfg.DB, c)
}
