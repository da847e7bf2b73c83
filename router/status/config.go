package status

import (
	"cmp"
	"errors"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/dlqreplay"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// Defaults of Limits: the thresholds of deploy/prometheus/alerts.yml.
const (
	ExpireBacklogDefault = 100              // PromotionExpireBacklogHigh
	OutboxBacklogDefault = 1000             // PromotionOutboxBacklogHigh
	HeldBackDefault      = 30 * time.Second // PromotionOutboxRelayHeldBack
	LagDefault           = time.Minute      // CatalogPromotionLagHigh (the SLO)
	DeadLetterWindowDef  = 10 * time.Minute // CatalogPromotionDeadLetters
	StuckDefault         = 2 * time.Minute  // CatalogPartitionStuck
	// OutboxLagDefault has no alert of its own: an event older than the
	// consumer's lag SLO in the outbox misses the SLO end to end, whatever
	// stopped the relay (no promotion process, an unreadable row, Kafka).
	OutboxLagDefault = time.Minute
)

// Limits are the points past which a part of the pipeline is red. A
// stalled expirer is one whose last cycle ended more than two of its
// process's intervals ago (PromotionExpireJobStalled); drift is red above 0
// cards (CatalogPromotionDrift).
type Limits struct {
	// ExpireBacklog is the most due purchases still Active. Defaults to 100.
	ExpireBacklog int
	// OutboxBacklog is the most events waiting in the outbox. Defaults to 1000.
	OutboxBacklog int
	// OutboxLag is the oldest outbox event's greatest age. Defaults to 1m.
	OutboxLag time.Duration
	// HeldBack is the longest an outbox writer may run. Defaults to 30s.
	HeldBack time.Duration
	// Lag is the greatest age of the oldest event the consumer has not
	// handled, on any partition. Defaults to 1m.
	Lag time.Duration
	// DeadLetterWindow: a dead letter newer than it is red. Defaults to 10m.
	DeadLetterWindow time.Duration
	// Stuck is the longest the consumer may keep failing on one record of a
	// partition. Defaults to 2m.
	Stuck time.Duration
}

func (l *Limits) setDefaults() {
	l.ExpireBacklog = cmp.Or(l.ExpireBacklog, ExpireBacklogDefault)
	l.OutboxBacklog = cmp.Or(l.OutboxBacklog, OutboxBacklogDefault)
	l.OutboxLag = cmp.Or(l.OutboxLag, OutboxLagDefault)
	l.HeldBack = cmp.Or(l.HeldBack, HeldBackDefault)
	l.Lag = cmp.Or(l.Lag, LagDefault)
	l.DeadLetterWindow = cmp.Or(l.DeadLetterWindow, DeadLetterWindowDef)
	l.Stuck = cmp.Or(l.Stuck, StuckDefault)
}

// Config configures a Reader.
type Config struct {
	// DB is the promoflow database. Required.
	DB *sqlx.DB
	// Kafka is the cluster of the topics. Required.
	Kafka kafkakit.Cluster
	// Topic is the purchase topic. Defaults to event.Topic.
	Topic string
	// ConsumerGroup is the catalog consumer's (router.CatalogConsumerGroup). Required.
	ConsumerGroup string
	// DeadLetters lists the DLQ (its DLQTopic and MaxReplays, which decides
	// what counts as parked); its Kafka is Kafka.
	DeadLetters dlqreplay.Config
	// Limits are the thresholds; zero fields take their defaults.
	Limits Limits
	// Log receives the Kafka clients' records. Defaults to slog.Default().
	Log *slog.Logger
}

// Validate reports every missing or out-of-range setting.
func (c Config) Validate() error {
	c.setDefaults() // a copy: what the component will run with
	var errs []error
	if c.DB == nil {
		errs = append(errs, errors.New("status: database is required"))
	}
	if c.ConsumerGroup == "" {
		errs = append(errs, errors.New("status: the consumer group is required"))
	}
	if err := c.Kafka.Validate(); err != nil {
		errs = append(errs, err)
	}
	l := c.Limits
	if l.ExpireBacklog < 0 || l.OutboxBacklog < 0 || l.OutboxLag < 0 || l.HeldBack < 0 || l.Lag < 0 || l.DeadLetterWindow < 0 {
		errs = append(errs, errors.New("status: limits must be >= 0"))
	}
	return errors.Join(append(errs, c.DeadLetters.Validate())...)
}

func (c *Config) setDefaults() {
	c.Topic = cmp.Or(c.Topic, event.Topic)
	c.DeadLetters.Kafka = c.Kafka
	c.DeadLetters.DLQTopic = cmp.Or(c.DeadLetters.DLQTopic, middleware.DLQTopicDefault)
	c.Log = cmp.Or(c.Log, slog.Default())
	c.DeadLetters.Log = c.Log
	c.Limits.setDefaults()
}
