package router

import (
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
)

// consume is the Promotion Boost handler: it parses one purchase-changed
// message and applies it in the unit of work's transaction. A payload that
// breaks the contract returns its *event.ContractError, which the retry
// middleware makes permanent (DLQ).
func consume(m *CatalogMetrics, log *slog.Logger, applier *boost.Prepared) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		start := time.Now()
		ev, err := event.Parse(msg.Payload)
		if err != nil {
			return err
		}
		out, err := applier.Apply(msg.Context(), middleware.Tx(msg.Context()), ev)
		if err != nil {
			return err
		}
		observe(m, log, msg, ev, out, time.Since(start))
		return nil
	}
}

// observe counts and logs what one event did (seed: consumed, skipped-stale,
// recomputed, with PurchaseId, Version and cardsAffected).
func observe(m *CatalogMetrics, log *slog.Logger, msg *message.Message, ev event.PurchaseChanged, out boost.Outcome, took time.Duration) {
	fields := []any{"MessageId", msg.UUID, "PurchaseId", ev.PurchaseId, "Version", ev.Version, "Status", ev.Status,
		"correlationId", msg.Metadata.Get(event.HeaderCorrelationID)}
	switch {
	case out.PostOnly:
		m.Consumed.WithLabelValues(outcomePostOnly).Inc()
		log.Info("skipped-post-only", fields...)
	case out.Stale:
		m.Stale.Inc()
		m.Consumed.WithLabelValues(outcomeStale).Inc()
		log.Info("skipped-stale", fields...)
	default:
		m.Consumed.WithLabelValues(outcomeApplied).Inc()
		m.CardsRecomputed.Add(float64(out.CardsRecomputed))
		log.Info("consumed", append(fields, "contributions", out.Contributions)...)
		if out.CardsRecomputed > 0 {
			log.Info("recomputed", append(fields, "cardsAffected", out.CardsRecomputed)...)
		}
	}
	m.ConsumeDuration.Observe(float64(took.Microseconds()) / 1000)
}
