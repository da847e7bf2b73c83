package router

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/outbox"
)

// topicRunbook is where an operator learns what to do with a purchase topic
// that is missing or changed.
const topicRunbook = "docs/runbooks/purchase-topic-changed.md"

// newTopicGuard guards the relay's purchase topic (outbox.TopicGuard):
// the metrics and the log say why the relay publishes nothing; nil when the
// relay has no topic to guard.
func newTopicGuard(db *sqlx.DB, m *PromotionMetrics, log *slog.Logger, cfg PromotionConfig) (*outbox.TopicGuard, error) {
	if cfg.Topic == "" {
		return nil, nil
	}
	return outbox.NewTopicGuard(outbox.TopicGuardConfig{
		Topic: cfg.Topic, DB: db, Interval: cfg.TopicCheckInterval,
		Describe: func(ctx context.Context) (outbox.TopicShape, error) {
			st, err := cfg.Kafka.DescribeTopic(ctx, cfg.Topic)
			return outbox.TopicShape(st), err
		},
		OnError: func(err error, holding bool) {
			if holding {
				// Said at each check (every 2 s): a relay that cannot check
				// its topic publishes nothing.
				log.Warn("purchase topic check failed: the relay publishes nothing until one succeeds",
					"topic", cfg.Topic, "error", err.Error(), "runbook", topicRunbook)
				return
			}
			log.Debug("purchase topic check failed; the last verdict stands", "topic", cfg.Topic, "error", err.Error())
		},
		OnChange: func(verdict error, pinned int32) {
			var changed *outbox.TopicChangedError
			m.OutboxTopicMissing.Set(boolGauge(errors.Is(verdict, outbox.ErrTopicMissing)))
			m.OutboxTopicChanged.Set(boolGauge(errors.As(verdict, &changed)))
			switch {
			case errors.Is(verdict, outbox.ErrTopicMissing):
				log.Error("purchase topic does not exist: the relay publishes nothing and keeps every event in the outbox until it is back; "+
					"create it again compacted with its pinned partition count, never let a client create it with the broker's defaults",
					"topic", cfg.Topic, "pinnedPartitions", pinned, "runbook", topicRunbook)
			case changed != nil:
				log.Error("purchase topic is not as pinned: the relay publishes nothing until it is; "+
					"never add partitions in place: move to a new topic and rebuild the catalog",
					"topic", cfg.Topic, "pinnedPartitions", changed.Pinned, "partitions", changed.Partitions,
					"cleanupPolicy", changed.CleanupPolicy, "runbook", topicRunbook)
			case verdict == nil:
				log.Info("purchase topic is as pinned: the relay publishes", "topic", cfg.Topic, "pinnedPartitions", pinned)
			}
		},
	})
}

// holdRelayOnTopic makes the topic guard, if any, part of the relay's step
// back: its verdict holds the relay, the step back's probe checks the topic
// too, and a step back asks for a check at once (a deleted topic fails a
// publish before a check sees it). It returns the partition counts the
// relay's producer hashes over (nil: the topics' own) and the guard's closer.
func holdRelayOnTopic(topics *outbox.TopicGuard, stepCfg *outbox.StepBackConfig) (pinned func(string) int32, closer func() error) {
	if topics == nil {
		return nil, func() error { return nil }
	}
	probe, onChange := stepCfg.Probe, stepCfg.OnChange
	stepCfg.Probe = func(ctx context.Context) error {
		if err := probe(ctx); err != nil {
			return err
		}
		return topics.Check(ctx)
	}
	stepCfg.OnChange = func(back bool, cause error, pause time.Duration) {
		if back {
			topics.Wake()
		}
		if onChange != nil {
			onChange(back, cause, pause)
		}
	}
	stepCfg.Hold = topics.Blocked
	return topics.Pinned, func() error { topics.Close(); return nil }
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
