package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/audit"
	"github.com/promoflow/promoflow/router/dlqreplay"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// CatalogConsumerGroup is the Promotion Boost consumer's group.
const CatalogConsumerGroup = "pin-catalog-promotion-boost"

// CatalogConfig wires the catalog router.
type CatalogConfig struct {
	// Brokers are the Kafka bootstrap servers.
	Brokers []string
	// Enabled is the feature flag catalog.promotions.enabled: when false the
	// router subscribes to nothing and the topic keeps the events.
	Enabled bool
	// Topic is the purchase-changed topic. Defaults to event.Topic.
	Topic string
	// ReplayTopic is where DLQ replays arrive. Defaults to dlqreplay.ReplayTopicDefault.
	ReplayTopic string
	// DLQTopic is the dead-letter topic. Defaults to middleware.DLQTopicDefault.
	DLQTopic string
	// ConsumerGroup defaults to CatalogConsumerGroup.
	ConsumerGroup string
	// RetryInitial and RetryMax bound the infrastructure backoff. Default 1s and 60s.
	RetryInitial, RetryMax time.Duration
	// DedupRetention is how long dedup keys are kept. Defaults to 7 days.
	DedupRetention time.Duration
	// JanitorInterval is the time between dedup key cleanups. Defaults to 1h.
	JanitorInterval time.Duration
	// AuditInterval is the time between audits of the card boosts against
	// the replica (catalog_promotion_drift_cards). Defaults to 5m.
	AuditInterval time.Duration
}

func (c *CatalogConfig) setDefaults() {
	c.Topic = cmp.Or(c.Topic, event.Topic)
	c.ReplayTopic = cmp.Or(c.ReplayTopic, dlqreplay.ReplayTopicDefault)
	c.DLQTopic = cmp.Or(c.DLQTopic, middleware.DLQTopicDefault)
	c.ConsumerGroup = cmp.Or(c.ConsumerGroup, CatalogConsumerGroup)
	c.RetryInitial = cmp.Or(c.RetryInitial, middleware.RetryInitialIntervalDefault)
	c.RetryMax = cmp.Or(c.RetryMax, middleware.RetryMaxIntervalDefault)
	c.DedupRetention = cmp.Or(c.DedupRetention, 7*24*time.Hour)
	c.JanitorInterval = cmp.Or(c.JanitorInterval, time.Hour)
	c.AuditInterval = cmp.Or(c.AuditInterval, 5*time.Minute)
}

// Validate reports every missing setting.
func (c CatalogConfig) Validate() error {
	if len(c.Brokers) == 0 {
		return errors.New("kafka brokers are required")
	}
	return nil
}

// CatalogChain is the consumer chain without the poison queue, for a
// projection rebuild run outside a catalog process: retry → contract version →
// unit of work → dedup → handler. The returned close releases its prepared
// statements.
func CatalogChain(db *sqlx.DB, m *CatalogMetrics, log *slog.Logger, cfg CatalogConfig) (message.HandlerFunc, func() error, error) {
	cfg.setDefaults()
	inner, err := innerChain(db, m, log, cfg, nil)
	if err != nil {
		return nil, nil, err
	}
	applier, err := boost.Prepare(context.Background(), db)
	if err != nil {
		return nil, nil, err
	}
	return chain(consume(m, log, applier), inner...), applier.Close, nil
}

// Catalog is the catalog context's single Watermill router: the Promotion
// Boost consumer on the purchase-changed topic and on the replay topic.
type Catalog struct {
	Router *message.Router
	// Chain is the consumer chain without the poison queue, for the rebuild.
	Chain   message.HandlerFunc
	closers []func() error
	tickers []*tickSource
	enabled bool
}

// NewCatalog builds the router. The chain, outermost first:
// poison queue → retry → contract version → unit of work → dedup → handler.
func NewCatalog(db *sqlx.DB, m *CatalogMetrics, log *slog.Logger, cfg CatalogConfig) (*Catalog, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r, wlog, err := newRouter(log)
	if err != nil {
		return nil, err
	}
	c := &Catalog{Router: r, enabled: cfg.Enabled}

	claims := middleware.NewClaims()
	inner, err := innerChain(db, m, log, cfg, claims)
	if err != nil {
		return nil, err
	}
	applier, err := boost.Prepare(context.Background(), db)
	if err != nil {
		return nil, err
	}
	c.closers = append(c.closers, applier.Close)
	handle := consume(m, log, applier)
	c.Chain = chain(handle, inner...)
	if !cfg.Enabled {
		log.Warn("catalog.promotions.enabled is false: not subscribing; the topic keeps the events")
		return c, nil
	}

	// A dead letter keeps its record's key, so the dead letters of one
	// purchase share a partition and a replay keeps their order.
	dlq, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               cfg.Brokers,
		Marshaler:             kafkakit.KeepKeyMarshaler{Fallback: middleware.DLQPartitionKey},
		OverwriteSaramaConfig: kafkakit.DurableProducerConfig("promoflow-catalog-dlq"),
	}, wlog)
	if err != nil {
		return nil, fmt.Errorf("dlq publisher: %w", err)
	}
	c.closers = append(c.closers, dlq.Close)
	poison, err := middleware.PoisonQueue(dlq, middleware.PoisonConfig{
		Topic: cfg.DLQTopic, Logger: log,
		OnDeadLetter: func(*message.Message, *middleware.Permanent) { m.DLQ.Inc() },
	})
	if err != nil {
		return nil, err
	}

	// The replay topic has a group of its own, so that its rebalances never
	// pause the main topic.
	for topic, group := range map[string]string{cfg.Topic: cfg.ConsumerGroup, cfg.ReplayTopic: cfg.ConsumerGroup + "-replay"} {
		sub, err := NewConsumerGroupSubscriber(cfg.Brokers, group, wlog, claims.Tracer())
		if err != nil {
			return nil, err
		}
		h := r.AddConsumerHandler("promotion_boost:"+topic, topic, sub, handle)
		h.AddMiddleware(append([]message.HandlerMiddleware{traceReceive, m.lag.middleware, poison}, inner...)...)
	}

	janitor := newTickSource("catalog.dedup-janitor.tick", cfg.JanitorInterval, wlog)
	r.AddConsumerHandler("dedup_janitor", janitor.topic, janitor.pubsub, func(msg *message.Message) error {
		n, err := middleware.CleanupDedupKeys(msg.Context(), db, cfg.DedupRetention)
		if err != nil {
			log.Warn("dedup key cleanup failed", "error", err.Error())
			return nil
		}
		m.DedupCleaned.Add(float64(n))
		return nil
	})
	auditor, err := audit.New(audit.Config{DB: db, Log: log})
	if err != nil {
		return nil, err
	}
	audits := newTickSource("catalog.audit.tick", cfg.AuditInterval, wlog)
	r.AddConsumerHandler("boost_audit", audits.topic, audits.pubsub, func(msg *message.Message) error {
		rep, err := auditor.Cards(msg.Context())
		if err != nil {
			log.Warn("card audit failed", "error", err.Error())
			return nil
		}
		m.DriftCards.Set(float64(rep.Drifted))
		if rep.Drifted > 0 {
			log.Warn("card boosts drifted from the replica", "drifted", rep.Drifted, "checked", rep.Checked,
				"samples", rep.Samples, "fix", "promoflow audit --repair")
		}
		return nil
	})
	c.tickers = append(c.tickers, janitor, audits)
	return c, nil
}

// innerChain is retry → contract version → unit of work → dedup.
func innerChain(db *sqlx.DB, m *CatalogMetrics, log *slog.Logger, cfg CatalogConfig, claims *middleware.Claims) ([]message.HandlerMiddleware, error) {
	retry, err := middleware.Retry(middleware.RetryConfig{
		IsConflict:      func(err error) bool { return errors.Is(err, boost.ErrConflict) },
		InitialInterval: cfg.RetryInitial, MaxInterval: cfg.RetryMax, Logger: log,
		OnRetry: func(*message.Message, string, int, time.Duration, error) { m.Retries.Inc() },
		Session: claims.Session,
	})
	if err != nil {
		return nil, err
	}
	dedup, err := middleware.Dedup(middleware.DedupConfig{
		Logger:      log,
		OnDuplicate: func(*message.Message) { m.Consumed.WithLabelValues("duplicate").Inc() },
	})
	if err != nil {
		return nil, err
	}
	return []message.HandlerMiddleware{
		retry,
		middleware.ContractVersion(event.ContractVersion, m.ContractMismatch, log),
		middleware.UnitOfWork(db),
		dedup,
	}, nil
}

// chain applies middlewares to h, the first outermost, as the router does.
func chain(h message.NoPublishHandlerFunc, mws ...message.HandlerMiddleware) message.HandlerFunc {
	out := func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) }
	for i := len(mws) - 1; i >= 0; i-- {
		out = mws[i](out)
	}
	return out
}

// NewConsumerGroupSubscriber is a Kafka subscriber of a consumer group that
// starts from the earliest offset when the group has none. tracer may be nil.
func NewConsumerGroupSubscriber(brokers []string, group string, wlog watermill.LoggerAdapter, tracer kafka.SaramaTracer) (*kafka.Subscriber, error) {
	sc := kafkakit.ClientConfig("promoflow-" + group)
	sc.Consumer.Return.Errors = true
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: brokers, Unmarshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc, ConsumerGroup: group,
		// A nack (a failed DLQ publish, a shutdown) redelivers after 1s, not in a hot loop.
		NackResendSleep: time.Second,
		Tracer:          tracer,
	}, wlog)
	if err != nil {
		return nil, fmt.Errorf("kafka subscriber %s: %w", group, err)
	}
	return sub, nil
}

// Ready reports whether the consumer runs (or is switched off by the flag).
func (c *Catalog) Ready() bool { return !c.enabled || c.Router.IsRunning() }

// Run runs the router until ctx is cancelled. With the flag off there is
// nothing to run: it waits for ctx.
func (c *Catalog) Run(ctx context.Context) error {
	if !c.enabled {
		<-ctx.Done()
		return closeAll(c.closers)
	}
	return runRouter(ctx, c.Router, c.tickers, c.closers)
}
