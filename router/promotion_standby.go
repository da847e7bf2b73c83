package router

import (
	"context"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/outbox"
)

// standbyGrantTimeout bounds the check of the relay role's grant at start.
const standbyGrantTimeout = 10 * time.Second

// relayStandbyFlush is the relay's outermost middleware when
// RelayStandbyFlush names standbys: a page waits for them before the
// position guard's lease and the step back's deadline check begin, so that
// the wait takes nothing from the publish. It refuses a role that cannot
// read the standbys' flush position.
func relayStandbyFlush(db *sqlx.DB, m *PromotionMetrics, log *slog.Logger, cfg PromotionConfig) ([]message.HandlerMiddleware, error) {
	if !cfg.RelayStandbyFlush.Enabled() {
		return nil, nil
	}
	flush, err := outbox.NewStandbyFlush(db.DB, outbox.StandbyFlushConfig{
		Standbys:       cfg.RelayStandbyFlush,
		PublishTimeout: cfg.RelayPublishTimeout,
		OnWait:         func(d time.Duration) { m.OutboxStandbyWait.Observe(d.Seconds()) },
		OnHeld: func(held bool, cause error) {
			if held {
				m.OutboxStandbyHeld.Set(1)
				log.Warn("relay publishes nothing: the standbys have not flushed its outbox page",
					"standbys", cfg.RelayStandbyFlush.String(), "error", cause.Error())
				return
			}
			m.OutboxStandbyHeld.Set(0)
			log.Info("the standbys caught up: the relay publishes again", "standbys", cfg.RelayStandbyFlush.String())
		},
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), standbyGrantTimeout)
	defer cancel()
	if err := flush.CheckGrant(ctx); err != nil {
		return nil, err
	}
	return []message.HandlerMiddleware{flush.Middleware}, nil
}
