package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/dberr"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/handlers/purchase"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// PromotionConfig wires the promotion router.
type PromotionConfig struct {
	// Kafka is the cluster the relay publishes to. Required.
	Kafka kafkakit.Cluster
	// Topic is the purchase topic. When set, the relay hashes its keys over
	// the topic's pinned partition count and publishes nothing while the
	// topic is missing, has another count or is not compacted
	// (outbox.TopicGuard). Optional.
	Topic string
	// TopicCheckInterval is the time between checks of Topic. Defaults to
	// outbox.TopicCheckIntervalDefault (30s).
	TopicCheckInterval time.Duration
	// JanitorInterval is the time between outbox cleanups. Defaults to 5s.
	JanitorInterval time.Duration
	// OutboxPollInterval is how often the relay polls an idle outbox. Defaults to 100ms.
	OutboxPollInterval time.Duration
	// OutboxBatchSize is how many outbox rows the relay reads per query and
	// acks at once. Defaults to OutboxBatchSizeDefault.
	OutboxBatchSize int
	// IdempotencyRetention is how long an Idempotency-Key is kept. Defaults
	// to purchase.IdempotencyRetentionDefault (24h).
	IdempotencyRetention time.Duration
	// KeyJanitorInterval is the time between idempotency key cleanups. Defaults to 10m.
	KeyJanitorInterval time.Duration
	// RelayPublisher sends the events of one outbox row, all in one Publish
	// call. Defaults to a kafkakit.BatchPublisher on Kafka.
	RelayPublisher message.Publisher
	// RelayPublishTimeout bounds one publish of the relay; past it the relay
	// cuts its producer off and steps back from the outbox position (see
	// addRelay). Defaults to kafkakit.PublishTimeoutDefault (10s).
	RelayPublishTimeout time.Duration
	// RelayStepBack paces the relay's step back after a failed publish; its
	// Probe defaults to a metadata request to Kafka.
	RelayStepBack outbox.StepBackConfig
	// RelayPosition is the relay's guard of its outbox position: how long a
	// good check of its session lets it write to Kafka (see addRelay).
	RelayPosition outbox.PositionGuardConfig
	// RelayTransactionalID is the relay producer's Kafka transactional.id, one
	// for every process of an outbox (see addRelay), e.g.
	// RelayTransactionalIDFor(Topic). Empty or RelayTransactionsOff (the
	// default): no transactions.
	RelayTransactionalID string
	// RelayStandbyFlush are the standbys that must have flushed a page
	// before the relay publishes it (outbox.StandbyFlush). Defaults to off.
	RelayStandbyFlush outbox.Standbys
}

// Defaults of PromotionConfig.
const (
	// OutboxBatchSizeDefault is the relay's rows per query: 100 rows of an
	// expirer's 200 events are 20k events, about 23 MB of outbox JSON held at
	// once, and what a crash mid-query may send again.
	OutboxBatchSizeDefault       = 100
	OutboxPollIntervalDefault    = 100 * time.Millisecond
	OutboxJanitorIntervalDefault = 5 * time.Second
	KeyJanitorIntervalDefault    = 10 * time.Minute
)

// Validate reports every missing or out-of-range setting.
func (c PromotionConfig) Validate() error {
	c.setDefaults() // a copy: what the component will run with
	var errs []error
	if err := c.Kafka.Validate(); err != nil {
		errs = append(errs, err)
	}
	for name, d := range map[string]time.Duration{"outbox janitor interval": c.JanitorInterval,
		"outbox poll interval": c.OutboxPollInterval, "idempotency key janitor interval": c.KeyJanitorInterval,
		"idempotency key retention": c.IdempotencyRetention, "relay publish timeout": c.RelayPublishTimeout,
		"relay topic check interval": c.TopicCheckInterval} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", name))
		}
	}
	if c.OutboxBatchSize < 1 {
		errs = append(errs, errors.New("outbox batch size must be >= 1"))
	}
	errs = append(errs, c.RelayStepBack.Validate(), c.RelayPosition.Validate())
	return errors.Join(errs...)
}

func (c *PromotionConfig) setDefaults() {
	c.JanitorInterval = cmp.Or(c.JanitorInterval, OutboxJanitorIntervalDefault)
	c.OutboxPollInterval = cmp.Or(c.OutboxPollInterval, OutboxPollIntervalDefault)
	c.OutboxBatchSize = cmp.Or(c.OutboxBatchSize, OutboxBatchSizeDefault)
	c.IdempotencyRetention = cmp.Or(c.IdempotencyRetention, purchase.IdempotencyRetentionDefault)
	c.KeyJanitorInterval = cmp.Or(c.KeyJanitorInterval, KeyJanitorIntervalDefault)
	c.RelayPublishTimeout = cmp.Or(c.RelayPublishTimeout, kafkakit.PublishTimeoutDefault)
	c.TopicCheckInterval = cmp.Or(c.TopicCheckInterval, outbox.TopicCheckIntervalDefault)
}

// heldBackLogAfter is how long an outbox writer may hold the relay back before
// each janitor tick names it in the log: far beyond any writer of ours.
const heldBackLogAfter = 10 * time.Second

// recordCycleTimeout bounds the write of a cycle's record.
const recordCycleTimeout = 5 * time.Second

// relayAckMargin is how much longer than a publish the relay's subscriber
// waits for a message's ack before it ends its transaction without one: the
// room a timed-out publish needs to cut its producer off and nack.
const relayAckMargin = 2 * time.Second

// Promotion is the promotion context's single Watermill router: the ticker-fed
// expirer, the outbox janitor, and the forwarder that relays the SQL outbox to Kafka.
type Promotion struct {
	Router  *message.Router
	tickers []*tickSource
	closers []func() error
}

// Topic names of the in-process tick streams.
const (
	expireTickTopic     = "promotion.expire.tick"
	janitorTickTopic    = "promotion.outbox-janitor.tick"
	keyJanitorTickTopic = "promotion.key-janitor.tick"
)

// NewPromotion builds the router. Run starts it.
func NewPromotion(db *sqlx.DB, exp *expire.Expirer, m *PromotionMetrics, log *slog.Logger, cfg PromotionConfig) (*Promotion, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r, wlog, err := newRouter(log)
	if err != nil {
		return nil, err
	}
	p := &Promotion{Router: r}

	expireTicks := newTickSource(expireTickTopic, exp.Interval(), wlog)
	// A database that takes no writes pauses the expirer: said once, not at each cycle.
	expireReadOnly := &dberr.Watch{OnChange: readOnlyLog(log, "expirer", "it expires nothing until the server takes writes")}
	wakeup := expire.NewWakeup(exp)
	expireTicks.early = wakeup
	r.AddConsumerHandler("expire_promotions", expireTickTopic, expireTicks.pubsub, func(msg *message.Message) error {
		res, err := exp.RunCycle(msg.Context())
		m.ObserveCycle(res, err)
		expireReadOnly.Observe(err)
		if err == nil {
			wakeup.After(res)
		}
		// The durable trace `promoflow status` reads; a cycle ended by a
		// shutdown is recorded all the same.
		recordCtx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), recordCycleTimeout)
		if rerr := exp.Record(recordCtx, res, err); rerr != nil && !dberr.ReadOnly(rerr) {
			log.Warn("expire cycle not recorded", "runId", res.RunID, "error", rerr.Error())
		}
		cancel()
		if err != nil && !dberr.ReadOnly(err) {
			// The next tick retries: the rows are still Active.
			log.Error("expire cycle failed", "runId", res.RunID, "error", err.Error())
		}
		return nil
	})

	janitorTicks := newTickSource(janitorTickTopic, cfg.JanitorInterval, wlog)
	r.AddConsumerHandler("outbox_janitor", janitorTickTopic, janitorTicks.pubsub, outboxJanitor(db, m, log))
	keyTicks := newTickSource(keyJanitorTickTopic, cfg.KeyJanitorInterval, wlog)
	r.AddConsumerHandler("idempotency_key_janitor", keyJanitorTickTopic, keyTicks.pubsub, func(msg *message.Message) error {
		n, err := purchase.CleanupIdempotencyKeys(msg.Context(), db, cfg.IdempotencyRetention)
		if err != nil {
			log.Warn("idempotency key cleanup failed", "error", err.Error())
		}
		m.KeysCleaned.Add(float64(n))
		return nil
	})
	p.tickers = []*tickSource{expireTicks, janitorTicks, keyTicks}

	if err := p.addRelay(db, m, log, wlog, cfg); err != nil {
		return nil, err
	}
	return p, nil
}

// addRelay adds the forwarder: outbox rows in commit order → Kafka, keyed by
// PurchaseId. A row carries its transaction's events, sent in one round trip.
// A failed send nacks the row, which is resent before any later one, so
// per-purchase order holds and delivery is at least once; the resend leaves
// out the events Kafka acknowledged already (kafkakit.Resender), so a partly
// refused group does not fill the topic with duplicates while Kafka is sick.
//
// The outbox position is the offsets row the subscriber's transaction locks
// while the relay publishes a page. A failed publish, or one that Kafka does
// not answer within RelayPublishTimeout (its producer is then cut off, so
// nothing of it reaches Kafka later), makes this process step back
// (outbox.StepBack): its transaction ends without an ack at the ack deadline,
// RelayPublishTimeout + relayAckMargin after the page's message was handed
// over, and another process takes the position, until this one reaches Kafka
// again.
//
// A relay whose position session ends under it (the lock is then free for
// another process at once) stops publishing within its lease
// (outbox.PositionGuard): each publish may write to Kafka only until
// RelayPosition.Lease after the last good check of the session, and a
// process that takes the position from a holder that did not commit waits
// longer than that before it reads.
//
// A purchase topic that is missing, has more or fewer partitions than
// pinned, or is not compacted (outbox.TopicGuard, checked every
// TopicCheckInterval and on each step back) holds the relay back the same
// way, with the events in the outbox; meanwhile its producer hashes each key
// over the pinned count, so a key never moves to a partition added in place.
//
// A holder frozen mid-publish may send, on thawing, what its lease no longer
// governs: with RelayTransactionalID (off by default) each page is a Kafka
// transaction, and the next holder fences the frozen producer
// (outbox.PageTransaction, kafkakit/page.go).
func (p *Promotion) addRelay(db *sqlx.DB, m *PromotionMetrics, log *slog.Logger, wlog watermill.LoggerAdapter, cfg PromotionConfig) error {
	topics, err := newTopicGuard(db, m, log, cfg)
	if err != nil {
		return err
	}
	stepCfg := cfg.RelayStepBack
	if stepCfg.Probe == nil {
		stepCfg.Probe = cfg.Kafka.Ping
	}
	stepCfg.PublishTimeout = cfg.RelayPublishTimeout
	// A publish refused for the lease lost its position, not Kafka. A fenced
	// one is not excused: two holders that fence each other step back.
	stepCfg.Excuse = func(err error) bool { return errors.Is(err, kafkakit.ErrLeaseExpired) }
	stepCfg.OnChange = func(back bool, cause error, pause time.Duration) {
		if back {
			m.OutboxSteppedBack.Set(1)
			m.OutboxStepBacks.Inc()
			log.Warn("relay steps back from the outbox position: publish failed", "pause", pause.String(), "error", cause.Error())
			return
		}
		m.OutboxSteppedBack.Set(0)
		log.Info("relay reaches Kafka again and rejoins the outbox position")
	}
	pinned, closeTopics := holdRelayOnTopic(topics, &stepCfg)
	p.closers = append(p.closers, closeTopics)
	stepBack, err := outbox.NewStepBack(stepCfg)
	if err != nil {
		return err
	}
	p.closers = append(p.closers, func() error { stepBack.Close(); return nil })
	posCfg := cfg.RelayPosition
	posCfg.OnLost = func(err error) {
		m.OutboxPositionLost.Inc()
		log.Warn("relay lost its outbox position session: it publishes nothing more of the page and reads again",
			"error", err.Error())
	}
	guard, err := outbox.NewPositionGuard(posCfg)
	if err != nil {
		return err
	}
	pub, pages, err := p.relayPublisher(cfg, guard, pinned, stepBack)
	if err != nil {
		return err
	}
	ackDeadline := cfg.RelayPublishTimeout + relayAckMargin
	readOnly := &dberr.Watch{OnChange: readOnlyLog(log, "relay", "it publishes nothing until the server takes writes")}
	countError := func(reason string) { m.OutboxRelayErrors.WithLabelValues(reason).Inc() }
	wsub, err := wmsql.NewSubscriber(db.DB, wmsql.SubscriberConfig{
		ConsumerGroup:  outbox.RelayConsumerGroup,
		SchemaAdapter:  outbox.RelaySchema(cfg.OutboxBatchSize, stepBack.Back, guard.TakeoverWait(), guard.IdleTimeout()),
		OffsetsAdapter: pages.Offsets(outbox.Offsets()),
		PollInterval:   cfg.OutboxPollInterval,
		AckDeadline:    &ackDeadline,
		BackoffManager: outbox.QueryBackoff{PollInterval: cfg.OutboxPollInterval, InRecovery: dberr.InRecovery(db.DB),
			OnError: countError, ReadOnly: readOnly},
	}, wlog)
	if err != nil {
		return fmt.Errorf("outbox subscriber: %w", err)
	}
	sub := outbox.PatientSubscriber{Subscriber: wsub, InRecovery: dberr.InRecovery(db.DB), ReadOnly: readOnly, OnError: countError}
	pub = stepBack.Publisher(pub)
	middlewares, err := relayStandbyFlush(db, m, log, cfg)
	if err != nil {
		return err
	}
	observeRelay := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			switch {
			case err == nil:
				m.OutboxRelayed.Add(float64(outbox.EventCount(msg)))
			case errors.Is(err, outbox.ErrSteppedBack):
				// Nothing was published; the subscriber gave the message up
				// at its ack deadline (the step back is logged once).
			case errors.Is(err, outbox.ErrNoTimeToPublish):
				// Nothing was published: the message reached the handler too
				// late for a publish to end before its ack deadline. Said
				// each time, because a relay that keeps meeting it relays
				// nothing.
				log.Warn("relay gives an outbox page up unpublished: its ack deadline leaves no time for a publish",
					"offset", msg.Metadata.Get(outbox.OffsetMetadataKey), "publishTimeout", cfg.RelayPublishTimeout.String())
			case errors.Is(err, outbox.ErrUnreadable):
				// The relay retries the row each second and relays nothing
				// behind it: loud, so that someone repairs it.
				m.OutboxUnreadable.Inc()
				log.Error("outbox row unreadable; the relay stops at it until it is repaired",
					"offset", msg.Metadata.Get(outbox.OffsetMetadataKey), "error", err.Error())
			}
			return out, err
		}
	}
	middlewares = append(middlewares, guard.Middleware, observeRelay, stepBack.Middleware)
	if pages != nil {
		middlewares = append(middlewares, pages.Middleware) // inside the guard: a page commits within its lease
	}
	_, err = forwarder.NewForwarder(sub, outbox.Unpacker{Publisher: kafkakit.NewResender(tracingPublisher{pub})}, wlog, forwarder.Config{
		ForwarderTopic: outbox.ForwarderTopic,
		Router:         p.Router,
		Middlewares:    middlewares,
	})
	if err != nil {
		return fmt.Errorf("outbox forwarder: %w", err)
	}
	return nil
}

// Run runs the router and its tickers until ctx is cancelled, then stops
// gracefully: the batch under way commits or rolls back whole.
func (p *Promotion) Run(ctx context.Context) error {
	return runRouter(ctx, p.Router, p.tickers, p.closers)
}

// runRouter runs r until ctx is cancelled, starts the tick sources once r
// runs, and closes what the router's handlers used once it stopped.
func runRouter(ctx context.Context, r *message.Router, tickers []*tickSource, closers []func() error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-r.Running():
		case <-ctx.Done():
			return
		}
		for _, t := range tickers {
			wg.Add(1)
			go func() { defer wg.Done(); t.run(ctx) }()
		}
	}()
	err := r.Run(ctx)
	cancel()
	for _, t := range tickers {
		_ = t.pubsub.Close()
	}
	wg.Wait()
	return errors.Join(err, closeAll(closers))
}

// closeAll closes what a router's handlers used.
func closeAll(closers []func() error) error {
	var errs []error
	for _, c := range closers {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

// CloseTimeout is the longest a router's Close waits for its handlers at a
// stop: longer than a batch or a message may take (an expirer batch commits
// within its 15 s, a relay publish ends within its 10 s + 2 s).
const CloseTimeout = 30 * time.Second

// newRouter is a Watermill router logging through log; Close waits up to
// CloseTimeout for handlers.
func newRouter(log *slog.Logger) (*message.Router, watermill.LoggerAdapter, error) {
	wlog := newWatermillLogger(log)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: CloseTimeout}, wlog)
	if err != nil {
		return nil, nil, fmt.Errorf("new router: %w", err)
	}
	return r, wlog, nil
}
