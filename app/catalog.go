package main

import (
	"cmp"
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

// catalogConfig is the catalog process's configuration: its flags bind
// straight onto the consumer's config, whose defaults they show.
type catalogConfig struct {
	commonConfig
	// FeedToken is the card feed's bearer token (the chessboard service's).
	FeedToken string
	// AdminToken is the operator's bearer token of /admin on the internal
	// listener; alone, it also serves the feed for one release.
	AdminToken string
	// RebuildCooldown refuses a rebuild requested within it after the last
	// one started, in any process.
	RebuildCooldown time.Duration
	// AdminRateLimit bounds the admin and feed tokens' calls.
	AdminRateLimit api.RateLimit
	secrets        []*secretSetting
	// MemoryLimit is the process's soft memory limit in bytes (0: from the
	// buffers, -1: none); see memoryLimit.
	MemoryLimit int
	Consumer    router.CatalogConfig
	Topics      topicConfig
}

func (c *catalogConfig) register(s *settings) {
	c.commonConfig.register(s, ":8081", "127.0.0.1:9081")
	s.bool(&c.Consumer.Enabled, "promotions-enabled", "CATALOG_PROMOTIONS_ENABLED", true, "feature flag catalog.promotions.enabled: when false the consumer does not subscribe")
	s.str(&c.Consumer.Topic, "topic", "PROMOTION_TOPIC", event.Topic, "Kafka topic of purchase-changed events")
	s.str(&c.Consumer.ReplayTopic, "replay-topic", "CATALOG_REPLAY_TOPIC", dlqreplay.ReplayTopicDefault, "topic of DLQ replays, read by this consumer only")
	s.str(&c.Consumer.DLQTopic, "dlq-topic", "CATALOG_DLQ_TOPIC", middleware.DLQTopicDefault, "dead-letter topic")
	s.str(&c.Consumer.ConsumerGroup, "consumer-group", "CATALOG_CONSUMER_GROUP", router.CatalogConsumerGroup, "Kafka consumer group")
	c.secrets = []*secretSetting{
		s.secretWithFile(&c.FeedToken, "feed-token", "CATALOG_FEED_TOKEN", "bearer token of the card feed (PUT /cards/..., the chessboard service) on the public listener; it also reads every card, private ones too (empty: the feed answers 401, unless only CATALOG_ADMIN_TOKEN is set); at least 16 characters"),
		s.secretWithFile(&c.AdminToken, "admin-token", "CATALOG_ADMIN_TOKEN", "bearer token of /admin/* on the internal listener (empty: they answer 401); set alone, it also serves the card feed for this release, with a warning; at least 16 characters"),
	}
	s.dur(&c.RebuildCooldown, "rebuild-cooldown", "REBUILD_COOLDOWN", rebuildCooldownDefault, "a projection rebuild requested within this long after the last one started (in any process) answers 429 with Retry-After; 0: none")
	rateLimitSettings(s, &c.AdminRateLimit, "admin", "ADMIN", "the feed's token, and apart the admin token,")
	c.registerTimings(s)
	c.registerBuffers(s)
	c.Topics.register(s)
}

// registerBuffers binds what the consumer holds in memory while it catches up.
func (c *catalogConfig) registerBuffers(s *settings) {
	b := &c.Consumer.Buffers
	s.int(&b.FetchPartitionBytes, "fetch-partition-bytes", "CATALOG_FETCH_PARTITION_BYTES", router.FetchPartitionBytesDefault, "most bytes one Kafka fetch asks of each partition (a larger record batch still comes whole)")
	s.int(&b.FetchResponseBytes, "fetch-response-bytes", "CATALOG_FETCH_RESPONSE_BYTES", router.FetchResponseBytesDefault, "most bytes of one Kafka fetch response over every partition")
	s.int(&b.ReadAhead, "read-ahead", "CATALOG_READ_AHEAD", router.ReadAheadDefault, "fetched records each partition may queue ahead of the one being handled")
	s.int(&b.Lanes, "lanes", "CATALOG_LANES", router.LanesDefault, "records of one partition handled at once, those of one purchase one after the other (1: one at a time)")
	s.int(&c.MemoryLimit, "memory-limit", "CATALOG_MEMORY_LIMIT", 0, "soft memory limit of the process in bytes (0: 60 MiB plus the read-ahead bytes and the fetch response bytes; -1: none; GOMEMLIMIT, when set, wins)")
	s.int(&b.ReadAheadBytes, "read-ahead-bytes", "CATALOG_READ_AHEAD_BYTES", router.ReadAheadBytesDefault, "most bytes of fetched records not yet handled, over every partition (each counted as key, value and headers plus 1 KiB)")
}

// registerTimings binds the consumer's backoff, retention and audit settings.
func (c *catalogConfig) registerTimings(s *settings) {
	s.dur(&c.Consumer.RetryInitial, "retry-initial", "CATALOG_RETRY_INITIAL", middleware.RetryInitialIntervalDefault, "first backoff after an infrastructure error")
	s.dur(&c.Consumer.RetryMax, "retry-max", "CATALOG_RETRY_MAX", middleware.RetryMaxIntervalDefault, "largest backoff after infrastructure errors")
	s.int(&c.Consumer.RetryUnnamedAttempts, "retry-unnamed-attempts", "CATALOG_RETRY_UNNAMED_ATTEMPTS", middleware.RetryUnnamedAttemptsDefault, "failures of an error of no class (middleware/doc.go) before a record that others outlive is dead-lettered as stuck_record")
	s.dur(&c.Consumer.RetryUnnamedAfter, "retry-unnamed-after", "CATALOG_RETRY_UNNAMED_AFTER", middleware.RetryUnnamedAfterDefault, "time an error of no class must keep failing one record, while others succeed, before it is dead-lettered as stuck_record")
	s.dur(&c.Consumer.DedupRetention, "dedup-retention", "CATALOG_DEDUP_RETENTION", router.DedupRetentionDefault, "how long dedup keys are kept")
	s.int(&c.Consumer.MaxBatch, "batch-max", "CATALOG_BATCH_MAX", middleware.GroupCommitMaxBatchDefault, "most events one consumer transaction applies")
	s.int(&c.Consumer.Workers, "batch-workers", "CATALOG_BATCH_WORKERS", middleware.GroupCommitWorkersDefault, "consumer transactions in flight at once")
	s.int(&c.Consumer.MaxLocks, "batch-max-locks", "CATALOG_BATCH_MAX_LOCKS", middleware.GroupCommitMaxLocksDefault, "most advisory locks (purchases and card targets) one consumer transaction takes; a wider event goes alone")
	s.dur(&c.Consumer.AuditInterval, "audit-interval", "CATALOG_AUDIT_INTERVAL", router.AuditIntervalDefault, "time between audits of card boosts against the replica (catalog_promotion_drift_cards)")
	registerPreparedStatements(s, &c.Consumer.DisablePreparedStatements)
}

func runCatalog(ctx context.Context, args []string) error {
	var cfg catalogConfig
	if err := parseCommand("catalog", "Runs the catalog context: the Promotion Boost consumer, the card feed and the projection rebuild.", args, cfg.register,
		func() error { return errors.Join(resolveSecrets(cfg.secrets...), cfg.validate()) }); err != nil {
		return err
	}
	log := cfg.logger("catalog")
	log.Info("memory limit", applyMemoryLimit(memoryLimit(cfg.MemoryLimit, cfg.Consumer.Buffers), log)...)
	return startCatalog(ctx, cfg, log)
}

func startCatalog(ctx context.Context, cfg catalogConfig, log *slog.Logger) error {
	logStart(log)
	cluster, err := cfg.Kafka.connect(ctx, log)
	if err != nil {
		return err
	}
	db, closeProcess, err := openProcess(ctx, "catalog", cfg.commonConfig, log)
	if err != nil {
		return err
	}
	defer closeProcess()
	cfg.Consumer.Kafka = cluster
	if err := cfg.Topics.ensure(cluster, log, cfg.Consumer.Topic, cfg.Consumer.ReplayTopic, cfg.Consumer.DLQTopic); err != nil {
		return err
	}
	reg := newRegistry()
	metrics, err := router.NewCatalogMetrics(reg)
	if err != nil {
		return err
	}
	c, err := router.NewCatalog(db, metrics, log, cfg.Consumer)
	if err != nil {
		return err
	}
	rebuilder, err := rebuild.New(rebuild.Config{DB: db, Kafka: cluster, Topic: cfg.Consumer.Topic, Log: log, Cooldown: cfg.RebuildCooldown})
	if err != nil {
		return err
	}
	checks := []readyCheck{dbReady(db), schemaReady(db, log), brokersReady(cluster.Brokers), routerReady(c.Ready)}
	public, internal := newPublicMux(checks...), newInternalMux(reg, checks...)
	(&api.Catalog{DB: db, FeedToken: cfg.feedToken(log), AdminToken: cfg.AdminToken, RateLimit: cfg.AdminRateLimit, Rebuilder: rebuilder, Log: log}).Register(public, internal)
	return runAll(ctx, log, append(cfg.listeners(public, internal, log),
		func(ctx context.Context) error { return c.Run(ctx) },
		func(ctx context.Context) error { <-ctx.Done(); rebuilder.Stop(); return nil })...)
}

// rebuildCooldownDefault spaces rebuilds: each one re-reads the whole
// purchase topic and rewrites the replica.
const rebuildCooldownDefault = 10 * time.Minute

// feedToken is the card feed's token: CATALOG_FEED_TOKEN, or for this
// release CATALOG_ADMIN_TOKEN alone, which served both before the feed had
// its own.
func (c catalogConfig) feedToken(log *slog.Logger) string {
	if c.FeedToken == "" && c.AdminToken != "" && !c.dev {
		log.Warn("deprecated: CATALOG_ADMIN_TOKEN also serves the card feed because CATALOG_FEED_TOKEN is not set; "+
			"give the chessboard service its own CATALOG_FEED_TOKEN: the next release serves the feed with it only", "setting", "CATALOG_FEED_TOKEN")
		return c.AdminToken
	}
	return cmp.Or(c.FeedToken, c.AdminToken)
}

func (c catalogConfig) validate() error {
	c.Consumer.Kafka.Brokers = splitList(c.Kafka.Brokers)
	errs := []error{c.commonConfig.validate(), c.HTTPLimits.validate(), c.APIEdge.validate(), validateRateLimit(c.AdminRateLimit, "ADMIN"), c.Topics.validate(),
		validateMemoryLimit(c.MemoryLimit), validateTokenLength(c.dev, "CATALOG_FEED_TOKEN", c.FeedToken),
		validateTokenLength(c.dev, "CATALOG_ADMIN_TOKEN", c.AdminToken)}
	if c.RebuildCooldown < 0 {
		errs = append(errs, errors.New("REBUILD_COOLDOWN must be >= 0 (0: no cooldown)"))
	}
	if len(c.Consumer.Kafka.Brokers) > 0 {
		errs = append(errs, c.Consumer.Validate())
	}
	return errors.Join(errs...)
}
