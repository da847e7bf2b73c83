package middleware_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// catalogDB is a migrated database of the test's own with the dedup table
// (until migration 0003 creates it, this does; IF NOT EXISTS keeps both working)
// and a test-only effects table whose counter stands for a handler's state change.
func catalogDB(t *testing.T) *sqlx.DB {
	t.Helper()
	db := pgtest.DB(t)
	_, err := db.Exec(`
		CREATE SCHEMA IF NOT EXISTS catalog;
		CREATE TABLE IF NOT EXISTS catalog.processed_messages (
			key text PRIMARY KEY,
			processed_at timestamptz NOT NULL DEFAULT now()
		);
		CREATE TABLE mwtest_effects (id text PRIMARY KEY, n int NOT NULL)`)
	require.NoError(t, err)
	return db
}

// applyEffect is a handler's state change for id (of any length: a
// MessageId), written in the unit of work's transaction.
func applyEffect(ctx context.Context, tx *sqlx.Tx, id string) error {
	_, err := tx.ExecContext(ctx,
		`INSERT INTO mwtest_effects (id, n) VALUES (md5($1), 1) ON CONFLICT (id) DO UPDATE SET n = mwtest_effects.n + 1`, id)
	return err
}

// effectCount is how often applyEffect committed for id.
func effectCount(t *testing.T, db *sqlx.DB, id string) int {
	t.Helper()
	var n int
	err := db.Get(&n, `SELECT coalesce((SELECT n FROM mwtest_effects WHERE id = md5($1)), 0)`, id)
	require.NoError(t, err)
	return n
}

func processedKeys(t *testing.T, db *sqlx.DB) []string {
	t.Helper()
	var keys []string
	require.NoError(t, db.Select(&keys, `SELECT key FROM catalog.processed_messages ORDER BY key`))
	return keys
}

// newMessage is a purchase-changed message with the contract headers.
func newMessage(t *testing.T) *message.Message {
	t.Helper()
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"any":"payload"}`))
	msg.Metadata.Set(event.HeaderContractVersion, event.ContractVersion)
	msg.Metadata.Set(event.HeaderAggregateID, uuid.NewString())
	return msg
}

// chain wraps h in mws, the first outermost, as the router does.
func chain(h message.HandlerFunc, mws ...message.HandlerMiddleware) message.HandlerFunc {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

// recordingPublisher keeps what it is given; it stands in for Kafka only where
// Kafka is not the subject of the test.
type recordingPublisher struct {
	mu   sync.Mutex
	err  error
	msgs []*message.Message
}

func (p *recordingPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return p.err
	}
	p.msgs = append(p.msgs, msgs...)
	return nil
}

func (p *recordingPublisher) Close() error { return nil }

func (p *recordingPublisher) published() []*message.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*message.Message(nil), p.msgs...)
}

func kafkaPublisher(t *testing.T, marshaler kafka.Marshaler) message.Publisher {
	t.Helper()
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               kafkatest.Brokers(t),
		Marshaler:             marshaler,
		OverwriteSaramaConfig: kafkatest.Cluster(t).DurableProducerConfig("test"),
	}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// runConsumer consumes topic with a real watermill-kafka subscriber in a router
// with the given middlewares, as the catalog router does, until the test ends.
func runConsumer(t *testing.T, topic string, h message.NoPublishHandlerFunc, mws ...message.HandlerMiddleware) {
	t.Helper()
	runGroupConsumer(t, topic, "pf-test-"+kafkatest.RandomSuffix(), nil, h, mws...)
}

// runGroupConsumer is runConsumer as a member of group, with tracer (may be nil)
// on its subscriber. It returns a stop function; the test's end stops it too.
func runGroupConsumer(t *testing.T, topic, group string, tracer kafka.SaramaTracer, h message.NoPublishHandlerFunc,
	mws ...message.HandlerMiddleware) (stop func()) {
	t.Helper()
	cfg := kafka.DefaultSaramaSubscriberConfig()
	cfg.Version = kafkakit.KafkaVersion
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               kafkatest.Brokers(t),
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: cfg,
		ConsumerGroup:         group,
		Tracer:                tracer,
	}, watermill.NopLogger{})
	require.NoError(t, err)

	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddMiddleware(mws...)
	r.AddConsumerHandler("test-consumer", topic, sub, h)

	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = r.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); _ = r.Close(); <-stopped }) }
	t.Cleanup(stop)
	<-r.Running()
	return stop
}
