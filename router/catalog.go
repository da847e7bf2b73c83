package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/dlqreplay"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// CatalogConsumerGroup is the Promotion Boost consumer's group.
const CatalogConsumerGroup = "pin-catalog-promotion-boost"

// ReplayGroupSuffix names the consumer's group on the replay topic: its
// group on the purchase topic with this suffix.
const ReplayGroupSuffix = "-replay"

// Defaults of CatalogConfig.
const (
	DedupRetentionDefault       = 7 * 24 * time.Hour
	DedupJanitorIntervalDefault = time.Hour
	AuditIntervalDefault        = 5 * time.Minute
)

// CatalogConfig wires the catalog router.
type CatalogConfig struct {
	// Kafka is the cluster the consumer reads and dead-letters to. Required.
	Kafka kafkakit.Cluster
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
	// RetryInitial and RetryMax bound the infrastructure backoff. Default 1s
	// and 60s (middleware.RetryInitialIntervalDefault, RetryMaxIntervalDefault).
	RetryInitial, RetryMax time.Duration
	// RetryUnnamedAttempts and RetryUnnamedAfter bound an error of no class
	// that fails one record while others succeed, before it is dead-lettered
	// as stuck_record. Default 10 and 5m (middleware.RetryUnnamedAttemptsDefault,
	// RetryUnnamedAfterDefault).
	RetryUnnamedAttempts int
	// RetryUnnamedAfter: see RetryUnnamedAttempts.
	RetryUnnamedAfter time.Duration
	// DedupRetention is how long dedup keys are kept. Defaults to 7 days.
	DedupRetention time.Duration
	// JanitorInterval is the time between dedup key cleanups. Defaults to 1h.
	JanitorInterval time.Duration
	// AuditInterval is the time between audits of the card boosts against
	// the replica (catalog_promotion_drift_cards). Defaults to 5m.
	AuditInterval time.Duration
	// MaxBatch caps the events of one consumer transaction. Defaults to
	// middleware.GroupCommitMaxBatchDefault.
	MaxBatch int
	// Workers caps the consumer transactions in flight at once. Defaults to
	// middleware.GroupCommitWorkersDefault.
	Workers int
	// MaxLocks caps the advisory locks of one consumer transaction (each
	// event's purchase and card targets, boost.Locks); an event wider than it
	// goes alone. Defaults to middleware.GroupCommitMaxLocksDefault.
	MaxLocks int
	// Buffers sizes what the consumer holds in memory while it catches up.
	// Zero fields take their defaults (ConsumerBuffers).
	Buffers ConsumerBuffers
	// DisablePreparedStatements sends the apply statements as text, parsed
	// at every execution, instead of preparing them once per connection
	// (boost.Prepare). A pooler in transaction mode (PgBouncer before 1.21)
	// lends each transaction whichever server connection is free, where a
	// statement prepared on another does not exist. Off, the apply path ran
	// 9-15 % slower at batches of 16 (docs/runbooks/postgres-connections.md).
	DisablePreparedStatements bool
}

// Validate reports every missing or out-of-range setting.
func (c CatalogConfig) Validate() error {
	c.setDefaults() // a copy: what the component will run with
	var errs []error
	if err := c.Kafka.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.RetryInitial <= 0 || c.RetryMax < c.RetryInitial {
		errs = append(errs, errors.New("retry intervals must be positive with max >= initial"))
	}
	if c.RetryUnnamedAttempts < 1 || c.RetryUnnamedAfter < 0 {
		errs = append(errs, errors.New("retry of unnamed errors: attempts must be >= 1 and the time >= 0"))
	}
	if c.MaxBatch < 1 || c.Workers < 1 || c.MaxLocks < 1 {
		errs = append(errs, errors.New("consumer max batch, workers and max locks must be positive"))
	}
	if err := c.Buffers.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.DedupRetention <= 0 || c.JanitorInterval <= 0 || c.AuditInterval <= 0 {
		errs = append(errs, errors.New("dedup retention, janitor and audit intervals must be positive"))
	}
	if c.ReplayTopic == c.Topic || c.DLQTopic == c.Topic || c.ReplayTopic == c.DLQTopic {
		errs = append(errs, errors.New("the purchase, replay and DLQ topics must differ"))
	}
	return errors.Join(errs...)
}

func (c *CatalogConfig) setDefaults() {
	c.Topic = cmp.Or(c.Topic, event.Topic)
	c.ReplayTopic = cmp.Or(c.ReplayTopic, dlqreplay.ReplayTopicDefault)
	c.DLQTopic = cmp.Or(c.DLQTopic, middleware.DLQTopicDefault)
	c.ConsumerGroup = cmp.Or(c.ConsumerGroup, CatalogConsumerGroup)
	c.RetryInitial = cmp.Or(c.RetryInitial, middleware.RetryInitialIntervalDefault)
	c.RetryMax = cmp.Or(c.RetryMax, middleware.RetryMaxIntervalDefault)
	c.RetryUnnamedAttempts = cmp.Or(c.RetryUnnamedAttempts, middleware.RetryUnnamedAttemptsDefault)
	c.RetryUnnamedAfter = cmp.Or(c.RetryUnnamedAfter, middleware.RetryUnnamedAfterDefault)
	c.DedupRetention = cmp.Or(c.DedupRetention, DedupRetentionDefault)
	c.JanitorInterval = cmp.Or(c.JanitorInterval, DedupJanitorIntervalDefault)
	c.AuditInterval = cmp.Or(c.AuditInterval, AuditIntervalDefault)
	c.MaxBatch = cmp.Or(c.MaxBatch, middleware.GroupCommitMaxBatchDefault)
	c.Workers = cmp.Or(c.Workers, middleware.GroupCommitWorkersDefault)
	c.MaxLocks = cmp.Or(c.MaxLocks, middleware.GroupCommitMaxLocksDefault)
	// The records out in lanes: what the group commit applies at once.
	c.Buffers.InFlight = cmp.Or(c.Buffers.InFlight, c.MaxBatch*c.Workers)
	c.Buffers.setDefaults()
}

// Catalog is the catalog context's single Watermill router: the Promotion
// Boost consumer on the purchase-changed topic and on the replay topic.
type Catalog struct {
	Router  *message.Router
	closers []func() error
	tickers []*tickSource
	enabled bool
}

// NewCatalog builds the router: the consumer chain (middleware/doc.go says
// why each step sits where it does), its two subscriptions, and the dedup
// janitor and boost audit ticks.
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
	// The consumer's offsets live with its projection (middleware/offsets.go).
	offsets := middleware.NewOffsets(db, log)
	// A stuck record fails at least once per longest backoff.
	m.Stuck.SetExpiry(cfg.RetryMax * 5 / 2)
	mw, err := newCatalogMiddlewares(db, m, log, cfg, claims, offsets)
	if err != nil {
		return nil, err
	}
	c.closers = append(c.closers, mw.close)
	handle := consume(m, log, mw.unitOfWork)
	if !cfg.Enabled {
		log.Warn("catalog.promotions.enabled is false: not subscribing; the topic keeps the events")
		return c, nil
	}
	parks := &middleware.Parks{DB: db, Log: log}
	dlq, dlqLimit, err := newDLQPublisher(cfg.Kafka, cfg.DLQTopic, wlog)
	if err != nil {
		return nil, err
	}
	c.closers = append(c.closers, dlq.Close)
	poison, err := middleware.PoisonQueue(dlq, middleware.PoisonConfig{
		Topic: cfg.DLQTopic, ReplayTopic: cfg.ReplayTopic, Logger: log, Fits: dlqLimit.Fits,
		OnDeadLetter: func(msg *message.Message, p *middleware.Permanent) {
			m.DLQ.Inc()
			if p.Code == middleware.CodeParked {
				parks.Done(msg)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	// The read-ahead's release goes outermost (nothing may hold a record it
	// still counts), then the receive span, which continues the trace of the
	// record's headers and names the topic's group (both added per topic
	// below).
	consumerChain := []message.HandlerMiddleware{
		m.lag.Middleware,
		poison,
		mw.retry,
		parks.Middleware,
		mw.contractVersion,
		mw.process,
	}
	// The replay topic has a group of its own, so that its rebalances never
	// pause the main topic.
	for topic, group := range map[string]string{cfg.Topic: cfg.ConsumerGroup, cfg.ReplayTopic: cfg.ConsumerGroup + ReplayGroupSuffix} {
		var onSession func()
		if topic == cfg.Topic {
			onSession = m.GroupSessions.Inc
		}
		sub, readAhead, err := NewConsumerGroupSubscriber(cfg.Kafka, group, cfg.Buffers, wlog, claims.Tracer(onSession), m.ReadAheadBytes, offsets)
		if err != nil {
			return nil, err
		}
		receive := middleware.Receive("catalog.promotion.receive", group)
		r.AddConsumerHandler("promotion_boost:"+topic, topic, sub, handle).AddMiddleware(append([]message.HandlerMiddleware{readAhead, receive}, consumerChain...)...)
	}
	if err := c.addJobs(db, m, log, cfg, wlog); err != nil {
		return nil, err
	}
	return c, nil
}

// catalogMiddlewares are the consumer's steps that need configuring, and
// the unit of work its handler applies events through. close releases the
// unit of work's prepared statements.
type catalogMiddlewares struct {
	retry, contractVersion, process message.HandlerMiddleware
	unitOfWork                      *unitOfWork
	close                           func() error
}

func newCatalogMiddlewares(db *sqlx.DB, m *CatalogMetrics, log *slog.Logger, cfg CatalogConfig, claims *middleware.Claims,
	offsets *middleware.Offsets) (catalogMiddlewares, error) {
	retry, err := middleware.Retry(middleware.RetryConfig{
		IsConflict:      func(err error) bool { return errors.Is(err, boost.ErrConflict) },
		InitialInterval: cfg.RetryInitial, MaxInterval: cfg.RetryMax, Logger: log,
		UnnamedAttempts: cfg.RetryUnnamedAttempts, UnnamedAfter: cfg.RetryUnnamedAfter,
		OnRetry: func(msg *message.Message, _ string, _ int, _ time.Duration, err error) {
			m.Retries.Inc()
			m.Stuck.Failed(db, msg, err)
		},
		Session: claims.Session,
	})
	if err != nil {
		return catalogMiddlewares{}, err
	}
	apply, closeApply := boost.ApplyBatch, func() error { return nil }
	if !cfg.DisablePreparedStatements {
		applier, err := boost.Prepare(context.Background(), db)
		if err != nil {
			return catalogMiddlewares{}, err
		}
		apply, closeApply = applier.ApplyBatch, applier.Close
	}
	uow, err := middleware.NewGroupCommit(middleware.GroupCommitConfig{
		DB: db, MaxBatch: cfg.MaxBatch, Workers: cfg.Workers, MaxLocks: cfg.MaxLocks,
		Dedup: middleware.DedupConfig{
			Logger:      log,
			OnDuplicate: func(*message.Message) { m.Consumed.WithLabelValues(outcomeDuplicate).Inc() },
			OnReused:    func(*message.Message) { m.MessageIDReused.Inc() },
		},
		OnBatch: func(size int, _ time.Duration) { m.BatchSize.Observe(float64(size)) },
		Offsets: offsets,
	}, apply, boost.Locks)
	if err != nil {
		return catalogMiddlewares{}, errors.Join(err, closeApply())
	}
	return catalogMiddlewares{
		retry:           retry,
		contractVersion: middleware.ContractVersion(event.ContractVersion, m.ContractMismatch, log),
		process:         middleware.Span("catalog.promotion.process", trace.SpanKindInternal),
		unitOfWork:      uow,
		close:           closeApply,
	}, nil
}

// newDLQPublisher writes dead letters under their record's key, so that the
// dead letters of one purchase share a partition and a replay keeps their order.
// It sends no record larger than the DLQ topic takes (limit.Fits).
func newDLQPublisher(cluster kafkakit.Cluster, topic string, wlog watermillLogger) (*kafka.Publisher, kafkakit.RecordLimit, error) {
	pub, limit, err := cluster.NewLimitedPublisher(context.Background(), topic, "promoflow-catalog-dlq",
		kafkakit.KeepKeyMarshaler{Fallback: middleware.DLQPartitionKey}, wlog)
	if err != nil {
		return nil, limit, fmt.Errorf("dlq: %w", err)
	}
	return pub, limit, nil
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
