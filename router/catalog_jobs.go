package router

import (
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/audit"
)

// addJobs adds the catalog's ticker-fed jobs: the dedup key janitor and the
// audit of card boosts against the replica.
func (c *Catalog) addJobs(db *sqlx.DB, m *CatalogMetrics, log *slog.Logger, cfg CatalogConfig, wlog watermillLogger) error {
	janitor := newTickSource("catalog.dedup-janitor.tick", cfg.JanitorInterval, wlog)
	c.Router.AddConsumerHandler("dedup_janitor", janitor.topic, janitor.pubsub, func(msg *message.Message) error {
		n, err := middleware.CleanupDedupKeys(msg.Context(), db, cfg.DedupRetention)
		if err != nil {
			log.Warn("dedup key cleanup failed", "error", err.Error())
		}
		m.DedupCleaned.Add(float64(n))
		return nil
	})
	auditor, err := audit.New(audit.Config{DB: db, Log: log})
	if err != nil {
		return err
	}
	audits := newTickSource("catalog.audit.tick", cfg.AuditInterval, wlog)
	c.Router.AddConsumerHandler("boost_audit", audits.topic, audits.pubsub, func(msg *message.Message) error {
		rep, err := auditor.Cards(msg.Context())
		if err != nil {
			log.Warn("card audit failed", "error", err.Error())
			return nil
		}
		m.DriftCards.Set(float64(rep.Drifted))
		if err := auditor.Record(msg.Context(), rep, audit.SourceCatalog); err != nil {
			log.Warn("card audit not recorded", "error", err.Error())
		}
		if rep.Drifted > 0 {
			log.Warn("card boosts drifted from the replica", "drifted", rep.Drifted, "checked", rep.Checked,
				"samples", rep.Samples, "fix", "promoflow audit --repair")
		}
		return nil
	})
	c.tickers = append(c.tickers, janitor, audits)
	return nil
}
