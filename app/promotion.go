package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/app/api"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/handlers/purchase"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// promotionConfig is the promotion process's configuration: its flags bind
// straight onto the components' configs, whose defaults they show.
type promotionConfig struct {
	commonConfig
	// Topic is the purchase topic: the expirer's and the API's events go there.
	Topic     string
	APITokens string
	apiTokens *secretSetting
	// RateLimit bounds each tenant's API calls.
	RateLimit api.RateLimit
	Expire    expire.Config
	Relay     router.PromotionConfig
	Purchases purchase.ServiceConfig
	Topics    topicConfig
}

func (c *promotionConfig) register(s *settings) {
	c.commonConfig.register(s, ":8080", "127.0.0.1:9080")
	s.str(&c.Topic, "topic", "PROMOTION_TOPIC", event.Topic, "Kafka topic of purchase-changed events")
	c.apiTokens = s.secretWithFile(&c.APITokens, "api-tokens", "PROMOTION_API_TOKENS", "bearer tokens of tenant managers: token=tenant-uuid,... (each at least 16 characters)")
	rateLimitSettings(s, &c.RateLimit, "api", "API", "each tenant (all its tokens)")
	s.dur(&c.Expire.Interval, "expire-interval", "EXPIRE_INTERVAL", expire.IntervalDefault, "time between expirer cycles (seed range 1m..5m)")
	s.int(&c.Expire.BatchSize, "expire-batch-size", "EXPIRE_BATCH_SIZE", expire.BatchSizeDefault, "most purchases one expirer transaction takes")
	s.dur(&c.Expire.MaxDuration, "expire-max-duration", "EXPIRE_MAX_DURATION", expire.MaxDurationDefault, "most time one cycle spends draining the backlog; a cycle it cuts is followed by the next at once")
	s.int(&c.Expire.Concurrency, "expire-concurrency", "EXPIRE_CONCURRENCY", expire.ConcurrencyDefault, "batch transactions of one cycle that run at once on a backlog (1..16)")
	s.notBool(&c.Expire.DisableWakeup, "expire-wakeup", "EXPIRE_WAKEUP", true, "also run a cycle at the earliest upcoming EndsAt, not only every interval")
	s.dur(&c.Expire.WakeupPoll, "expire-wakeup-poll", "EXPIRE_WAKEUP_POLL", expire.WakeupPollDefault, "how often the earliest upcoming EndsAt is re-read (a purchase created on another instance re-arms the wake-up within it)")
	s.dur(&c.Relay.OutboxPollInterval, "outbox-poll-interval", "OUTBOX_POLL_INTERVAL", router.OutboxPollIntervalDefault, "how often the relay polls an idle outbox")
	s.int(&c.Relay.OutboxBatchSize, "outbox-batch-size", "OUTBOX_BATCH_SIZE", router.OutboxBatchSizeDefault, "outbox rows the relay reads per query (a row holds one transaction's events)")
	s.dur(&c.Relay.RelayPublishTimeout, "relay-publish-timeout", "RELAY_PUBLISH_TIMEOUT", kafkakit.PublishTimeoutDefault,
		"most time one publish of the relay waits for Kafka; then the relay cuts that producer off and lets another process take the outbox position")
	s.dur(&c.Relay.RelayPosition.Lease, "relay-position-lease", "RELAY_POSITION_LEASE", outbox.PositionLeaseDefault,
		"how long after a good check of its outbox position's database session the relay may write to Kafka; a process that takes the position from one that lost it waits 1.25 times this before it reads, and a holder idle in its transaction for twice this (at least 3s) loses its session")
	s.str(&c.Relay.RelayTransactionalID, "relay-transactional-id", "RELAY_TRANSACTIONAL_ID", "",
		"Kafka transactional.id of the relay's producer, the same in every promotion process of one outbox (e.g. "+router.RelayTransactionalIDFor("<PROMOTION_TOPIC>")+"): each outbox page the relay reads is one Kafka transaction, and the process that takes the outbox position fences the producer of the one before it, so a frozen holder's late requests never reach the topic; "+
			"empty or "+router.RelayTransactionsOff+" (the default): an idempotent producer without transactions, a frozen holder fenced on PostgreSQL's side only (docs/architecture.md, \"The relay position\")")
	s.value(&c.Relay.RelayStandbyFlush, "relay-standby-flush", "RELAY_STANDBY_FLUSH",
		"publish an outbox page only once these standbys have flushed it: their application_names separated by commas, any (at least one standby), or off; "+
			"needs pg_read_all_stats (or pg_monitor) for the relay's role; not needed with synchronous replication (docs/operations.md)")
	s.dur(&c.Relay.TopicCheckInterval, "relay-topic-check-interval", "RELAY_TOPIC_CHECK_INTERVAL", outbox.TopicCheckIntervalDefault,
		"time between the relay's checks of the purchase topic (exists, pinned partition count, compacted); the relay publishes nothing while one fails")
	s.dur(&c.Purchases.IdempotencyRetention, "idempotency-retention", "IDEMPOTENCY_KEY_RETENTION", purchase.IdempotencyRetentionDefault, "how long an Idempotency-Key returns its first purchase; then it is deleted")
	c.Topics.register(s)
}

// wire fills in what the components share: the topic, the brokers, the retention.
func (c *promotionConfig) wire() {
	c.Expire.Topic, c.Purchases.Topic, c.Relay.Topic = c.Topic, c.Topic, c.Topic
	c.Relay.Kafka.Brokers = splitList(c.Kafka.Brokers)
	c.Relay.IdempotencyRetention = c.Purchases.IdempotencyRetention
}

func (c promotionConfig) validate() error {
	c.wire()
	errs := []error{c.commonConfig.validate(), c.HTTPLimits.validate(), c.APIEdge.validate(), validateRateLimit(c.RateLimit, "API"), c.Topics.validate(),
		c.Expire.Validate(), c.Purchases.Validate()}
	if _, err := api.ParseTokens(c.APITokens, tokenMinLength(c.dev)); err != nil {
		errs = append(errs, fmt.Errorf("PROMOTION_API_TOKENS: %w", err))
	}
	if len(c.Relay.Kafka.Brokers) > 0 {
		errs = append(errs, c.Relay.Validate())
	}
	return errors.Join(errs...)
}

func runPromotion(ctx context.Context, args []string) error {
	var cfg promotionConfig
	if err := parseCommand("promotion", "Runs the promotion context: the purchase API, the expirer and the outbox relay.", args, cfg.register,
		func() error { return errors.Join(cfg.apiTokens.resolve(), cfg.validate()) }); err != nil {
		return err
	}
	log := cfg.logger("promotion")
	log.Info("memory limit", applyMemoryLimit(0, log)...)
	return startPromotion(ctx, cfg, log)
}

func startPromotion(ctx context.Context, cfg promotionConfig, log *slog.Logger) error {
	logStart(log)
	tokens, _ := api.ParseTokens(cfg.APITokens, tokenMinLength(cfg.dev))
	if len(tokens) == 0 {
		log.Warn("no API tokens configured: every purchase API call answers 401")
	}
	cluster, err := cfg.Kafka.connect(ctx, log)
	if err != nil {
		return err
	}
	db, closeProcess, err := openProcess(ctx, "promotion", cfg.commonConfig, log)
	if err != nil {
		return err
	}
	defer closeProcess()
	cfg.wire()
	cfg.Relay.Kafka = cluster
	if err := cfg.Topics.ensure(cluster, log, cfg.Topic); err != nil {
		return err
	}

	reg := newRegistry()
	metrics, err := router.NewPromotionMetrics(reg)
	if err != nil {
		return err
	}
	exp, err := expire.New(db, cfg.Expire, log)
	if err != nil {
		return err
	}
	r, err := router.NewPromotion(db, exp, metrics, log, cfg.Relay)
	if err != nil {
		return err
	}
	purchases, err := purchase.NewService(db, cfg.Purchases)
	if err != nil {
		return err
	}

	checks := []readyCheck{primaryReady(db), schemaReady(db, log), routerReady(r.Router.IsRunning)}
	public, internal := newPublicMux(checks...), newInternalMux(reg, checks...)
	(&api.Promotions{Service: purchases, Tokens: tokens, RateLimit: cfg.RateLimit, Log: log}).Register(public)
	return runAll(ctx, log, append(cfg.listeners(public, internal, log),
		func(ctx context.Context) error { return r.Run(ctx) })...)
}

func dbReady(db *sqlx.DB) readyCheck {
	return func(ctx context.Context) error {
		if err := db.PingContext(ctx); err != nil {
			return &notReady{Component: "database", Err: err}
		}
		return nil
	}
}

// primaryReady checks that db reaches a writable primary: the purchase API
// and the expirer write, so a standby (a single-host URL after a failover)
// or a server set read-only cannot serve them. It reads the server anew each
// time, so a standby that is promoted makes the process ready without a
// restart.
func primaryReady(db *sqlx.DB) readyCheck {
	return func(ctx context.Context) error {
		var standby, readOnly bool
		err := db.QueryRowContext(ctx, `SELECT pg_is_in_recovery(), current_setting('transaction_read_only')::boolean`).
			Scan(&standby, &readOnly)
		switch {
		case err != nil:
			return &notReady{Component: "database", Err: err}
		case standby:
			return &notReady{Component: "database", Err: errors.New("the server is a standby (in recovery) and takes no writes; " +
				"list the primary and its standbys with target_session_attrs=read-write (docs/runbooks/postgres-connections.md)")}
		case readOnly:
			return &notReady{Component: "database", Err: errors.New("transaction_read_only is on (default_transaction_read_only): the server takes no writes")}
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
		return &notReady{Component: "kafka", Err: errors.Join(errs...)}
	}
}

func routerReady(running func() bool) readyCheck {
	return func(context.Context) error {
		if !running() {
			return &notReady{Component: "router", Err: errors.New("not running")}
		}
		return nil
	}
}
