package router

import (
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/dberr"
	"github.com/promoflow/promoflow/handlers/outbox"
)

// outboxJanitor is the handler of the janitor's ticks: it re-bases the
// outbox onto its cluster when a restore brought it from another one (before
// any writer or relay read does, in a short transaction of its own), deletes
// the relayed rows, and reports the backlog and the writer that holds the
// relay back.
func outboxJanitor(db *sqlx.DB, m *PromotionMetrics, log *slog.Logger) message.NoPublishHandlerFunc {
	clusters := outbox.NewClusterWatch()
	readOnly := &dberr.Watch{OnChange: readOnlyLog(log, "outbox janitor", "it deletes no relayed outbox rows until the server takes writes")}
	return func(msg *message.Message) error {
		if c, err := outbox.ResolveCluster(msg.Context(), db); err != nil {
			if !dberr.ReadOnly(err) {
				log.Warn("outbox cluster unresolved", "error", err.Error())
			}
		} else if n := clusters.Rebased(c); n > 0 {
			m.OutboxRebased.Add(float64(n))
			var previous int64
			if c.PreviousSystemIdentifier != nil {
				previous = *c.PreviousSystemIdentifier
			}
			log.Warn("outbox re-based onto another cluster: its rows sort above the restored relay position, which is relayed on from there",
				"systemIdentifier", c.SystemIdentifier, "previousSystemIdentifier", previous, "xidShift", c.XidShift)
		}
		cleaned, err := outbox.Cleanup(msg.Context(), db)
		readOnly.Observe(err)
		if err != nil && !dberr.ReadOnly(err) {
			log.Warn("outbox cleanup failed", "error", err.Error())
		}
		stats, err := outbox.ReadStats(msg.Context(), db)
		if err != nil {
			log.Warn("outbox stats failed", "error", err.Error())
			return nil
		}
		m.ObserveOutbox(stats, cleaned)
		w, held, err := outbox.OldestWriter(msg.Context(), db)
		if err != nil {
			log.Warn("outbox writers failed", "error", err.Error())
			return nil
		}
		m.OutboxHeldBack.Set(w.Age.Seconds())
		if held && w.Age >= heldBackLogAfter {
			log.Warn("an outbox writer holds the relay back: no later promotion event reaches Kafka until it ends",
				"pid", w.PID, "application", w.Application, "state", w.State, "transactionAge", w.Age.Round(time.Millisecond).String())
		}
		return nil
	}
}
