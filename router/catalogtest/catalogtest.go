// Package catalogtest runs the catalog router against the real PostgreSQL and
// Kafka of the test environment, for the tests of the router and of the
// operator tools around it (rebuild, DLQ replay). Each bundle has its own
// database, topics and consumer group.
package catalogtest

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/bounded"
	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// Bundle is one catalog under test.
type Bundle struct {
	DB *sqlx.DB
	// URL is the database's, for a process that a test starts.
	URL     string
	Cfg     router.CatalogConfig
	Metrics *router.CatalogMetrics
	Catalog *router.Catalog
	// Pub publishes to the bundle's topics, keyed by PurchaseId.
	Pub *kafka.Publisher
}

// New makes a bundle: a migrated database, a compacted purchase topic of 3
// partitions (as production creates it), a replay topic and a DLQ.
func New(t testing.TB, enabled bool) *Bundle {
	t.Helper()
	return NewOn(t, pgtest.DatabaseURL(t), enabled)
}

// NewOn is New on the database at url (a private server's, say), which it
// migrates.
func NewOn(t testing.TB, url string, enabled bool) *Bundle {
	t.Helper()
	b := &Bundle{
		DB: pgtest.Open(t, url), URL: url,
		Cfg: router.CatalogConfig{
			Kafka: kafkatest.Cluster(t), Enabled: enabled,
			Topic:       kafkatest.TopicWith(t, kafkakit.Topic{Partitions: 3, CleanupPolicy: kafkakit.PolicyCompact}),
			ReplayTopic: kafkatest.Topic(t, 1), DLQTopic: kafkatest.Topic(t, 1),
			ConsumerGroup: "pf-test-catalog-" + kafkatest.RandomSuffix(),
			RetryInitial:  10 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		},
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: b.Cfg.Kafka.Brokers, Marshaler: kafka.NewWithPartitioningMarshaler(event.PartitionKey),
		OverwriteSaramaConfig: b.Cfg.Kafka.DurableProducerConfig("test-producer"),
	}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	b.Pub = pub
	return b
}

// Start runs the catalog router until the test ends, or until the returned
// stop is called. It uses b.Metrics when set (a test may wrap one of them).
func (b *Bundle) Start(t testing.TB) (stop func()) {
	t.Helper()
	if b.Metrics == nil {
		m, err := router.NewCatalogMetrics(prometheus.NewRegistry())
		require.NoError(t, err)
		b.Metrics = m
	}
	c, err := router.NewCatalog(b.DB, b.Metrics, slog.New(slog.DiscardHandler), b.Cfg)
	require.NoError(t, err)
	b.Catalog = c
	return RunUntilCleanup(t, c.Run, c.Ready)
}

// Produce publishes ev to the purchase topic as the relay would and returns its message.
func (b *Bundle) Produce(t testing.TB, ev event.PurchaseChanged) *message.Message {
	t.Helper()
	msg, err := event.NewMessage(ev, "test", time.Now())
	require.NoError(t, err)
	require.NoError(t, b.Pub.Publish(b.Cfg.Topic, msg))
	return msg
}

// ProduceRaw publishes bytes with the contract headers, keyed by key.
func (b *Bundle) ProduceRaw(t testing.TB, key string, payload []byte) *message.Message {
	t.Helper()
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.Metadata.Set(event.HeaderContractVersion, event.ContractVersion)
	msg.Metadata.Set(event.HeaderAggregateID, key)
	msg.Metadata.Set(event.HeaderCorrelationID, "test")
	require.NoError(t, b.Pub.Publish(b.Cfg.Topic, msg))
	return msg
}

// ProjectCard upserts a project card through the feed.
func (b *Bundle) ProjectCard(t testing.TB, id uuid.UUID) {
	t.Helper()
	tx := b.DB.MustBegin()
	price := "1000000"
	require.NoError(t, boost.UpsertProjectCardTx(context.Background(), tx, boost.ProjectCard{ID: id, Title: "P",
		Status: "Published", Visibility: "Visible", MinPrice: &price, PropertyObjectsAvailable: 3, Payback: &price}))
	require.NoError(t, tx.Commit())
}

// ObjectCard upserts a property-object card through the feed.
func (b *Bundle) ObjectCard(t testing.TB, id, project uuid.UUID, published bool) {
	t.Helper()
	tx := b.DB.MustBegin()
	price := "250000"
	require.NoError(t, boost.UpsertPropertyObjectCardTx(context.Background(), tx, boost.PropertyObjectCard{
		ID: id, ProjectID: project, Published: published, Status: "OnSale", Price: &price}))
	require.NoError(t, tx.Commit())
}

// BoostOf is a card's boost, or -1 when there is no such card.
func (b *Bundle) BoostOf(kind event.TargetKind, id uuid.UUID) int {
	var n int
	table := "catalog.project_cards"
	if kind == event.TargetPropertyObject {
		table = "catalog.property_object_cards"
	}
	if err := b.DB.Get(&n, `SELECT promotion_boost FROM `+table+` WHERE id = $1`, id); err != nil {
		return -1
	}
	return n
}

// WaitBoost waits until a card's boost is want.
func (b *Bundle) WaitBoost(t testing.TB, kind event.TargetKind, id uuid.UUID, want int) {
	t.Helper()
	require.Eventually(t, func() bool { return b.BoostOf(kind, id) == want }, 30*time.Second, 10*time.Millisecond,
		"%s %s: want boost %d, have %d", kind, id, want, b.BoostOf(kind, id))
}

// Consumed is how many events the consumer handled, whatever the outcome.
func (b *Bundle) Consumed() float64 {
	var sum float64
	for _, o := range []string{"applied", "stale", "duplicate", "post_only"} {
		sum += testutil.ToFloat64(b.Metrics.Consumed.WithLabelValues(o))
	}
	return sum
}

// WaitConsumed waits until n events were handled (any outcome).
func (b *Bundle) WaitConsumed(t testing.TB, n float64, timeout time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return b.Consumed() >= n }, timeout, 10*time.Millisecond,
		"consumed %v of %v", b.Consumed(), n)
}

// CardBoosts maps every card to its boost.
func (b *Bundle) CardBoosts(t testing.TB) map[uuid.UUID]int {
	t.Helper()
	var rows []struct {
		ID    uuid.UUID `db:"id"`
		Boost int       `db:"promotion_boost"`
	}
	require.NoError(t, b.DB.Select(&rows, `SELECT id, promotion_boost FROM catalog.project_cards
		UNION ALL SELECT id, promotion_boost FROM catalog.property_object_cards`))
	out := map[uuid.UUID]int{}
	for _, r := range rows {
		out[r.ID] = r.Boost
	}
	return out
}

// PurchaseEvent is a snapshot of a new purchase, valid for an hour.
func PurchaseEvent(status event.Status, version int64, weight int, targets ...event.Target) event.PurchaseChanged {
	return event.PurchaseChanged{PurchaseId: uuid.New(), TenantId: uuid.New(), PackageKind: "Top", Targets: targets,
		BoostWeight: weight, Status: status, PaymentStatus: "NotRequired",
		StartsAt: time.Now().Add(-time.Hour).UTC(), EndsAt: time.Now().Add(time.Hour).UTC(), Version: version}
}

// Target is one promoted entity.
func Target(kind event.TargetKind, id uuid.UUID) event.Target {
	return event.Target{TargetKind: kind, TargetId: id}
}

// TopicSize counts the records of topic that a read_committed consumer
// reads: the relay's transaction markers and aborted records take offsets
// but are no records.
func TopicSize(t testing.TB, topic string) int64 {
	t.Helper()
	client, err := bounded.Dial(kafkatest.Cluster(t), "promoflow-test")
	require.NoError(t, err)
	defer client.Close()
	parts, err := client.Partitions(topic)
	require.NoError(t, err)
	ranges := make([]bounded.Range, len(parts))
	for i, p := range parts {
		ranges[i] = p.Whole()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var total atomic.Int64
	require.NoError(t, client.Read(ctx, ranges, func(context.Context, *sarama.ConsumerMessage) error {
		total.Add(1)
		return nil
	}, nil))
	return total.Load()
}

// PartitionSizes maps every partition of topic to its high-water mark.
func PartitionSizes(t testing.TB, topic string) map[int32]int64 {
	t.Helper()
	client, err := sarama.NewClient(kafkatest.Brokers(t), kafkatest.Cluster(t).ClientConfig("promoflow-test"))
	require.NoError(t, err)
	defer client.Close()
	parts, err := client.Partitions(topic)
	require.NoError(t, err)
	out := make(map[int32]int64, len(parts))
	for _, p := range parts {
		off, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		require.NoError(t, err)
		out[p] = off
	}
	return out
}

// RunUntilCleanup runs a router until the test ends, after it is ready, and
// checks that it stops cleanly. The returned stop stops it before the end.
func RunUntilCleanup(t testing.TB, run func(context.Context) error, ready func() bool) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(45 * time.Second):
				t.Error("router did not stop within 45s")
			}
		})
	}
	t.Cleanup(stop)
	require.Eventually(t, ready, 30*time.Second, 10*time.Millisecond, "router did not start")
	return stop
}

// RefusedByPostgres is a record check (the rebuild's and the audit's
// SetCheck seams) that checks each record as the consumer does, then gives
// the event of purchase id at version an EndsAt that PostgreSQL refuses
// (22008, timestamp out of range) in any form: the record stands for one
// whose row PostgreSQL refuses, handed to the loader below the parser, which
// refuses such a time itself.
func RefusedByPostgres(id uuid.UUID, version int64) func(key, value []byte) (event.PurchaseChanged, error) {
	return func(key, value []byte) (event.PurchaseChanged, error) {
		ev, err := boost.CheckRecord(key, value)
		if err == nil && ev.PurchaseId == id && ev.Version == version {
			ev.EndsAt = time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)
		}
		return ev, err
	}
}
