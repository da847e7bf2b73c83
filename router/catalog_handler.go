package router

import (
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// unitOfWork is the consumer's group commit: dedup keys and boost.ApplyBatch
// for the events that wait together, one transaction per batch.
type unitOfWork = middleware.GroupCommit[event.PurchaseChanged, boost.Outcome]

// consume is the Promotion Boost handler: it parses one purchase-changed
// message, checks that its record key is its PurchaseId, and applies it
// through the unit of work, with the events of other purchases that wait at
// the same time. A payload that breaks the contract returns its
// *event.ContractError, a record keyed otherwise its *event.KeyError; the
// retry middleware makes both permanent (DLQ). Every message comes from a
// Kafka record with its key (the subscriber's); a message without one fails
// the key check.
func consume(m *CatalogMetrics, log *slog.Logger, uow *unitOfWork) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		start := time.Now()
		ev, err := event.Parse(msg.Payload)
		if err != nil {
			return err
		}
		key, _ := kafkakit.KeyOf(msg)
		if err := event.CheckKey(key, ev); err != nil {
			return err
		}
		out, dup, err := uow.Do(msg, ev.PurchaseId.String(), ev)
		if err != nil || dup {
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
	m.ConsumeSeconds.Observe(took.Seconds())
}
