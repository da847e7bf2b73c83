package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/app/api"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/purchase"
	"github.com/promoflow/promoflow/router"
)

// promotionConfig is the promotion process's configuration.
type promotionConfig struct {
	commonConfig
	Topic             string
	APITokens         string
	ExpireInterval    time.Duration
	ExpireBatchSize   int
	ExpireMaxDuration time.Duration
	ExpireWakeup      bool
	ExpireWakeupPoll  time.Duration
	OutboxPoll        time.Duration
	OutboxBatchSize   int
	KeyRetention      time.Duration
	Topics            topicConfig
}

func (c *promotionConfig) register(s *settings) {
	c.commonConfig.register(s, ":8080")
	s.str(&c.Topic, "topic", "PROMOTION_TOPIC", event.Topic, "Kafka topic of purchase-changed events")
	s.str(&c.APITokens, "api-tokens", "PROMOTION_API_TOKENS", "", "bearer tokens of tenant managers: token=tenant-uuid,...")
	s.dur(&c.ExpireInterval, "expire-interval", "EXPIRE_INTERVAL", 60*time.Second, "time between expirer cycles (seed range 1m..5m)")
	s.int(&c.ExpireBatchSize, "expire-batch-size", "EXPIRE_BATCH_SIZE", expire.BatchSizeDefault, "most purchases one expirer transaction takes")
	s.dur(&c.ExpireMaxDuration, "expire-max-duration", "EXPIRE_MAX_DURATION", expire.MaxDurationDefault, "most time one cycle spends draining the backlog")
	s.bool(&c.ExpireWakeup, "expire-wakeup", "EXPIRE_WAKEUP", true, "also run a cycle at the earliest upcoming EndsAt, not only every interval")
	s.dur(&c.ExpireWakeupPoll, "expire-wakeup-poll", "EXPIRE_WAKEUP_POLL", expire.WakeupPollDefault, "how often the earliest upcoming EndsAt is re-read (a purchase created on another instance re-arms the wake-up within it)")
	s.dur(&c.OutboxPoll, "outbox-poll-interval", "OUTBOX_POLL_INTERVAL", 100*time.Millisecond, "how often the relay polls an idle outbox")
	s.int(&c.OutboxBatchSize, "outbox-batch-size", "OUTBOX_BATCH_SIZE", router.OutboxBatchSizeDefault, "outbox rows the relay reads per query (a row holds one transaction's events)")
	s.dur(&c.KeyRetention, "idempotency-retention", "IDEMPOTENCY_KEY_RETENTION", purchase.IdempotencyRetentionDefault, "how long an Idempotency-Key returns its first purchase; then it is deleted")
	c.Topics.register(s)
}

func (c promotionConfig) validate() error {
	errs := []error{c.commonConfig.validate()}
	if _, err := api.ParseTokens(c.APITokens); err != nil {
		errs = append(errs, err)
	}
	if c.ExpireInterval <= 0 {
		errs = append(errs, errors.New("expire interval must be positive"))
	}
	if c.KeyRetention <= 0 {
		errs = append(errs, errors.New("idempotency key retention must be positive"))
	}
	errs = append(errs, c.Topics.validate())
	return errors.Join(errs...)
}

func runPromotion(ctx context.Context, args []string) error {
	var cfg promotionConfig
	s := newSettings("promotion", "Runs the promotion context: the purchase API, the expirer and the outbox relay.")
	cfg.register(s)
	if err := s.parse(args); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	return startPromotion(ctx, cfg, newLogger(cfg.LogLevel, "promotion"))
}

func startPromotion(ctx context.Context, cfg promotionConfig, log *slog.Logger) error {
	stopTracing, err := setupTracing(ctx, "promotion")
	if err != nil {
		return err
	}
	defer stopTracing(context.WithoutCancel(ctx)) //nolint:errcheck // best effort flush at exit
	tokens, _ := api.ParseTokens(cfg.APITokens)
	if len(tokens) == 0 {
		log.Warn("no API tokens configured: every purchase API call answers 401")
	}

	db, err := openDB(ctx, cfg.commonConfig, log)
	if err != nil {
		return err
	}
	defer db.Close()
	brokers := splitList(cfg.KafkaBrokers)
	if err := cfg.Topics.ensure(brokers, log, cfg.Topic); err != nil {
		return err
	}

	reg := newRegistry()
	metrics, err := router.NewPromotionMetrics(reg)
	if err != nil {
		return err
	}
	exp, err := expire.New(db, expire.Config{BatchSize: cfg.ExpireBatchSize, MaxDuration: cfg.ExpireMaxDuration, Topic: cfg.Topic,
		WakeupPoll: cfg.ExpireWakeupPoll, DisableWakeup: !cfg.ExpireWakeup}, log)
	if err != nil {
		return err
	}
	r, err := router.NewPromotion(db, exp, metrics, log, router.PromotionConfig{
		Brokers: brokers, ExpireInterval: cfg.ExpireInterval,
		OutboxPollInterval: cfg.OutboxPoll, OutboxBatchSize: cfg.OutboxBatchSize, IdempotencyRetention: cfg.KeyRetention,
	})
	if err != nil {
		return err
	}

	mux := newMux(reg, dbReady(db), routerReady(r.Router.IsRunning))
	(&api.Promotions{Service: &purchase.Service{DB: db, Topic: cfg.Topic, IdempotencyRetention: cfg.KeyRetention}, Tokens: tokens, Log: log}).Register(mux)
	return runAll(ctx, log,
		func(ctx context.Context) error { return r.Run(ctx) },
		func(ctx context.Context) error { return serveHTTP(ctx, cfg.HTTPAddr, api.JSONErrors(mux), log) },
	)
}

func dbReady(db *sqlx.DB) readyCheck {
	return func(ctx context.Context) error {
		if err := db.PingContext(ctx); err != nil {
			return fmt.Errorf("database: %w", err)
		}
		return nil
	}
}

// brokersReady checks that a Kafka broker accepts connections: the catalog
// consumes nothing while none does. (The promotion API stays ready without
// Kafka: its writes go to the outbox, and the relay catches up.)
func brokersReady(brokers []string) readyCheck {
	return func(ctx context.Context) error {
		var d net.Dialer
		var errs []error
		for _, b := range brokers {
			conn, err := d.DialContext(ctx, "tcp", b)
			if err == nil {
				_ = conn.Close()
				return nil
			}
			errs = append(errs, err)
		}
		return fmt.Errorf("kafka: %w", errors.Join(errs...))
	}
}

func routerReady(running func() bool) readyCheck {
	return func(context.Context) error {
		if !running() {
			return errors.New("router is not running")
		}
		return nil
	}
}
