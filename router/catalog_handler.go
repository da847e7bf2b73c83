package router

import (
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
)

// consume adapts one purchase-changed message to boost's Apply (with its
// prepared statements) inside the unit of work's transaction. A payload that
// breaks the contract returns its *event.ContractError, which the retry
// middleware makes permanent (DLQ).
func consume(m *CatalogMetrics, log *slog.Logger, applier *boost.Prepared) message.NoPublishHandlerFunc {
	return func(msg *message.Message) (err error) {
		start := time.Now()
		ctx, span := tracer.Start(msg.Context(), "catalog.promotion.process")
		defer func() { endSpan(span, err); span.End() }()
		ev, err := event.Parse(msg.Payload)
		if err != nil {
			return err
		}
		storeCtx, store := tracer.Start(ctx, "catalog.promotion.store")
		out, err := applier.Apply(storeCtx, middleware.Tx(ctx), ev)
		endSpan(store, err)
		store.End()
		if err != nil {
			return err
		}
		fields := []any{"MessageId", msg.UUID, "PurchaseId", ev.PurchaseId, "Version", ev.Version,
			"Status", ev.Status, "correlation_id", msg.Metadata.Get(event.HeaderCorrelationID)}
		switch {
		case out.PostOnly:
			m.Consumed.WithLabelValues("post_only").Inc()
			log.Info("skipped-post-only", fields...)
		case out.Stale:
			m.Stale.Inc()
			m.Consumed.WithLabelValues("stale").Inc()
			log.Info("skipped-stale", fields...)
		default:
			m.Consumed.WithLabelValues("applied").Inc()
			m.CardsRecomputed.Add(float64(out.CardsRecomputed))
			log.Info("consumed", append(fields, "contributions", out.Contributions)...)
			if out.CardsRecomputed > 0 {
				log.Info("recomputed", append(fields, "cardsAffected", out.CardsRecomputed)...)
			}
		}
		m.ConsumeDuration.Observe(float64(time.Since(start).Microseconds()) / 1000)
		return nil
	}
}
