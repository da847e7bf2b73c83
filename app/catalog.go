package main

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/promoflow/promoflow/app/api"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/dlqreplay"
	"github.com/promoflow/promoflow/router/rebuild"
)

// catalogConfig is the catalog process's configuration.
type catalogConfig struct {
	commonConfig
	Enabled        bool
	Topic          string
	ReplayTopic    string
	DLQTopic       string
	ConsumerGroup  string
	AdminToken     string
	RetryInitial   time.Duration
	RetryMax       time.Duration
	DedupRetention time.Duration
	AuditInterval  time.Duration
	Topics         topicConfig
}

func (c *catalogConfig) register(s *settings) {
	c.commonConfig.register(s, ":8081")
	s.bool(&c.Enabled, "promotions-enabled", "CATALOG_PROMOTIONS_ENABLED", true, "feature flag catalog.promotions.enabled: when false the consumer does not subscribe")
	s.str(&c.Topic, "topic", "PROMOTION_TOPIC", event.Topic, "Kafka topic of purchase-changed events")
	s.str(&c.ReplayTopic, "replay-topic", "CATALOG_REPLAY_TOPIC", dlqreplay.ReplayTopicDefault, "topic of DLQ replays, read by this consumer only")
	s.str(&c.DLQTopic, "dlq-topic", "CATALOG_DLQ_TOPIC", middleware.DLQTopicDefault, "dead-letter topic")
	s.str(&c.ConsumerGroup, "consumer-group", "CATALOG_CONSUMER_GROUP", router.CatalogConsumerGroup, "Kafka consumer group")
	s.str(&c.AdminToken, "admin-token", "CATALOG_ADMIN_TOKEN", "", "bearer token of the card feed and /admin endpoints (empty: they answer 401)")
	s.dur(&c.RetryInitial, "retry-initial", "CATALOG_RETRY_INITIAL", time.Second, "first backoff after an infrastructure error")
	s.dur(&c.RetryMax, "retry-max", "CATALOG_RETRY_MAX", time.Minute, "largest backoff after infrastructure errors")
	s.dur(&c.DedupRetention, "dedup-retention", "CATALOG_DEDUP_RETENTION", 7*24*time.Hour, "how long dedup keys are kept")
	s.dur(&c.AuditInterval, "audit-interval", "CATALOG_AUDIT_INTERVAL", 5*time.Minute, "time between audits of card boosts against the replica (catalog_promotion_drift_cards)")
	c.Topics.register(s)
}

func runCatalog(ctx context.Context, args []string) error {
	var cfg catalogConfig
	s := newSettings("catalog", "Runs the catalog context: the Promotion Boost consumer, the card feed and the projection rebuild.")
	cfg.register(s)
	if err := s.parse(args); err != nil {
		return err
	}
	if err := errors.Join(cfg.commonConfig.validate(), cfg.Topics.validate()); err != nil {
		return err
	}
	return startCatalog(ctx, cfg, newLogger(cfg.LogLevel, "catalog"))
}

func startCatalog(ctx context.Context, cfg catalogConfig, log *slog.Logger) error {
	stopTracing, err := setupTracing(ctx, "catalog")
	if err != nil {
		return err
	}
	defer stopTracing(context.WithoutCancel(ctx)) //nolint:errcheck // best effort flush at exit
	db, err := openDB(ctx, cfg.commonConfig, log)
	if err != nil {
		return err
	}
	defer db.Close()
	brokers := splitList(cfg.KafkaBrokers)
	if err := cfg.Topics.ensure(brokers, log, cfg.Topic, cfg.ReplayTopic, cfg.DLQTopic); err != nil {
		return err
	}
	reg := newRegistry()
	metrics, err := router.NewCatalogMetrics(reg)
	if err != nil {
		return err
	}
	c, err := router.NewCatalog(db, metrics, log, router.CatalogConfig{
		Brokers: brokers, Enabled: cfg.Enabled, Topic: cfg.Topic, ReplayTopic: cfg.ReplayTopic,
		DLQTopic: cfg.DLQTopic, ConsumerGroup: cfg.ConsumerGroup, RetryInitial: cfg.RetryInitial, RetryMax: cfg.RetryMax,
		DedupRetention: cfg.DedupRetention, AuditInterval: cfg.AuditInterval,
	})
	if err != nil {
		return err
	}
	rebuilder, err := rebuild.New(rebuild.Config{DB: db, Brokers: brokers, Topic: cfg.Topic, Chain: c.Chain, Log: log})
	if err != nil {
		return err
	}
	mux := newMux(reg, dbReady(db), brokersReady(brokers), routerReady(c.Ready))
	(&api.Catalog{DB: db, AdminToken: cfg.AdminToken, Rebuilder: rebuilder, Log: log}).Register(mux)
	return runAll(ctx, log,
		func(ctx context.Context) error { return c.Run(ctx) },
		func(ctx context.Context) error { return serveHTTP(ctx, cfg.HTTPAddr, api.JSONErrors(mux), log) },
		func(ctx context.Context) error { <-ctx.Done(); rebuilder.Stop(); return nil },
	)
}
