package router

import (
	"context"
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
		if len(msg.Payload) == 0 {
			// A tombstone (a null value) is no purchase change: the contract
			// makes it a no-op, counted, so that a producer's delete marker
			// neither stalls the partition nor reaches the DLQ.
			m.Consumed.WithLabelValues(outcomeTombstone).Inc()
			key, _ := kafkakit.KeyOf(msg)
			log.Warn("skipped-tombstone", "MessageId", msg.UUID, "key", string(key))
			return nil
		}
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
// recomputed, with PurchaseId, Version and cardsAffected). Its attributes are
// strings and numbers, which slog's JSON handler writes without reflection.
func observe(m *CatalogMetrics, log *slog.Logger, msg *message.Message, ev event.PurchaseChanged, out boost.Outcome, took time.Duration) {
	ctx := context.Background()
	info := log.Enabled(ctx, slog.LevelInfo)
	var fields []slog.Attr
	if info {
		fields = []slog.Attr{slog.String("MessageId", msg.UUID), slog.String("PurchaseId", ev.PurchaseId.String()),
			slog.Int64("Version", ev.Version), slog.String("Status", string(ev.Status)),
			slog.String("correlationId", msg.Metadata.Get(event.HeaderCorrelationID))}
	}
	logInfo := func(message string, extra ...slog.Attr) {
		if info {
			log.LogAttrs(ctx, slog.LevelInfo, message, append(fields[:len(fields):len(fields)], extra...)...)
		}
	}
	switch {
	case out.PostOnly:
		m.Consumed.WithLabelValues(outcomePostOnly).Inc()
		logInfo("skipped-post-only")
	case out.Stale:
		m.Stale.Inc()
		m.Consumed.WithLabelValues(outcomeStale).Inc()
		logInfo("skipped-stale")
	default:
		m.Consumed.WithLabelValues(outcomeApplied).Inc()
		m.CardsRecomputed.Add(float64(out.CardsRecomputed))
		logInfo("consumed", slog.Int("contributions", out.Contributions))
		if out.CardsRecomputed > 0 {
			logInfo("recomputed", slog.Int("cardsAffected", out.CardsRecomputed))
		}
	}
	m.ConsumeDuration.Observe(float64(took.Microseconds()) / 1000)
	m.ConsumeSeconds.Observe(took.Seconds())
}
