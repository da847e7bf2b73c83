package router_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/handlers/purchase"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/router/status"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// setupCompactedPromotion is setupPromotion on a purchase topic made as the
// processes make it: compacted.
func setupCompactedPromotion(t *testing.T, partitions int32) promotionBundle {
	t.Helper()
	t.Parallel()
	return promotionBundle{db: pgtest.DB(t),
		topic: kafkatest.TopicWith(t, kafkakit.Topic{Partitions: partitions, CleanupPolicy: kafkakit.PolicyCompact})}
}

// topicAdmin is an admin client of the test's broker, closed when the test ends.
func topicAdmin(t *testing.T) sarama.ClusterAdmin {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(kafkatest.Brokers(t), kafkatest.Cluster(t).ClientConfig("promoflow-test"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	return admin
}

// outboxBacklog is how many events wait in the outbox.
func outboxBacklog(t *testing.T, b promotionBundle) int64 {
	t.Helper()
	stats, err := outbox.ReadStats(t.Context(), b.db)
	require.NoError(t, err)
	return stats.Backlog
}

// TestRelay_NeverCreatesADeletedTopic: the purchase topic is deleted under
// a running relay and a running catalog consumer, and events are written.
// Neither creates the topic again with the broker's defaults (it stays
// missing while the relay polls for seconds); the relay reports the topic
// missing and keeps the events in the outbox; once the topic is created
// again as it was, it publishes them.
func TestRelay_NeverCreatesADeletedTopic(t *testing.T) {
	t.Parallel()
	catalog := catalogtest.New(t, true) // its purchase topic: compacted, 3 partitions
	b := promotionBundle{db: catalog.DB, topic: catalog.Cfg.Topic}
	catalog.Start(t)
	b.startRouter(t, router.PromotionConfig{Topic: b.topic, TopicCheckInterval: 200 * time.Millisecond,
		RelayStepBack: outbox.StepBackConfig{Pause: 100 * time.Millisecond, MaxPause: 500 * time.Millisecond}},
		expire.Config{Interval: time.Hour}, slog.New(slog.DiscardHandler))
	writeOutbox(t, b, purchaseEvents(t, 1, "before-delete"))
	kafkatest.ReadTopic(t, b.topic, time.Minute, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 1 })

	require.NoError(t, topicAdmin(t).DeleteTopic(b.topic))
	cluster := kafkatest.Cluster(t)
	missing := func() bool {
		st, err := cluster.DescribeTopic(t.Context(), b.topic) // an admin request: it creates nothing
		return err == nil && st.Missing
	}
	require.Eventually(t, missing, 30*time.Second, 50*time.Millisecond, "the topic was not deleted")
	events := purchaseEvents(t, 20, "after-delete")
	for _, ev := range events {
		writeOutbox(t, b, []*message.Message{ev})
	}
	require.Never(t, func() bool { return !missing() }, 5*time.Second, 100*time.Millisecond,
		"the deleted topic exists again: the relay or the catalog consumer re-created it with the broker's defaults")
	require.Eventually(t, func() bool { return testutil.ToFloat64(b.metrics.OutboxTopicMissing) == 1 },
		10*time.Second, 20*time.Millisecond, "the relay does not report the missing topic")
	require.EqualValues(t, 20, outboxBacklog(t, b), "the events wait in the outbox")

	_, err := kafkakit.EnsureTopics(cluster, kafkakit.Topic{Name: b.topic, Partitions: 3, CleanupPolicy: kafkakit.PolicyCompact})
	require.NoError(t, err)
	want, got := relayed(t, b.topic, [][]*message.Message{events})
	require.ElementsMatch(t, want, got, "once the topic is back, every event that waited is published once")
	require.Eventually(t, func() bool { return testutil.ToFloat64(b.metrics.OutboxTopicMissing) == 0 },
		10*time.Second, 20*time.Millisecond, "the relay still reports the topic missing")
}

// TestRelay_StopsWhenPartitionsWereAdded: partitions are added to the
// purchase topic under a running relay, and a second process starts with
// the new count in its metadata. Within their check interval both stop
// publishing (the events stay in the outbox) and report it; the first
// stops, and the second publishes nothing either; status says why; no
// purchase's records land in two partitions.
func TestRelay_StopsWhenPartitionsWereAdded(t *testing.T) {
	b := setupCompactedPromotion(t, 2)
	rcfg := router.PromotionConfig{Topic: b.topic, TopicCheckInterval: 300 * time.Millisecond}
	log := slog.New(slog.DiscardHandler)
	stopRunning := b.startRouter(t, rcfg, expire.Config{Interval: time.Hour}, log)
	running := b.metrics
	ids := make([]uuid.UUID, 40)
	for i := range ids {
		ids[i] = uuid.New()
	}
	versions := func(v int64) []*message.Message {
		out := make([]*message.Message, len(ids))
		for i, id := range ids {
			out[i] = versionMessage(t, id, v, "partitions-added")
		}
		return out
	}
	writeOutbox(t, b, versions(1))
	kafkatest.ReadTopic(t, b.topic, time.Minute, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= len(ids) })

	require.NoError(t, topicAdmin(t).CreatePartitions(b.topic, 4, nil, false))
	b.startRouter(t, rcfg, expire.Config{Interval: time.Hour}, log)
	started := b.metrics
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(running.OutboxTopicChanged) == 1 && testutil.ToFloat64(started.OutboxTopicChanged) == 1
	}, 5*time.Second, 20*time.Millisecond, "the relays do not report the added partitions within their check interval")
	stopRunning() // as in a rolling restart: the events go to the process with the new count in its metadata

	writeOutbox(t, b, versions(2))
	require.Never(t, func() bool { return catalogtest.TopicSize(t, b.topic) > int64(len(ids)) }, 3*time.Second, 100*time.Millisecond,
		"a relay published to the topic after partitions were added")
	require.EqualValues(t, len(ids), outboxBacklog(t, b), "the events wait in the outbox")

	reader, err := status.New(status.Config{DB: b.db, Kafka: kafkatest.Cluster(t), Topic: b.topic,
		ConsumerGroup: "pf-test-status-" + kafkatest.RandomSuffix(), Log: log})
	require.NoError(t, err)
	rep := reader.Read(t.Context())
	require.True(t, rep.Outbox.Red(), "status shows the outbox healthy")
	require.Contains(t, rep.Outbox.Problems, status.Problem{Alert: "PromotionOutboxTopicChanged",
		Detail: "the relay publishes nothing: topic " + b.topic + " has 4 partitions (pinned 2) and cleanup.policy=compact (want 2 and compact); " +
			"never add partitions in place: move to a new topic and rebuild the catalog"})

	partitionOf := map[string]int32{}
	for _, r := range kafkatest.ReadTopic(t, b.topic, time.Minute, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= len(ids) }) {
		key := string(r.Key)
		if p, ok := partitionOf[key]; ok {
			require.Equal(t, p, r.Partition, "purchase %s has records in two partitions (message %s)", key, kafkatest.Header(r, kafka.UUIDHeaderKey))
		}
		partitionOf[key] = r.Partition
	}
}

// TestRepublish_FillsANewPurchaseTopicWithEveryPurchase: a relay on a new
// purchase topic publishes what purchase.Republish writes: one record per
// purchase, of its current Version, keyed by its id, in the partition the
// pinned hash gives it.
func TestRepublish_FillsANewPurchaseTopicWithEveryPurchase(t *testing.T) {
	b := setupCompactedPromotion(t, 3)
	ids := purchasetest.SeedActive(t, b.db, 25, time.Now().Add(time.Hour))
	var tenant uuid.UUID
	require.NoError(t, b.db.Get(&tenant, `SELECT tenant_id FROM promotion.promotion_purchases WHERE id = $1`, ids[0]))
	_, err := purchasetest.NewService(t, b.db, b.topic).Cancel(t.Context(), tenant, ids[0], "test")
	require.NoError(t, err)
	b.startRouter(t, router.PromotionConfig{Topic: b.topic, TopicCheckInterval: 200 * time.Millisecond},
		expire.Config{Interval: time.Hour}, slog.New(slog.DiscardHandler))

	var batches int
	n, err := purchase.Republish(t.Context(), b.db, purchase.RepublishConfig{Topic: b.topic, BatchSize: 10},
		func(int, uuid.UUID) { batches++ })
	require.NoError(t, err)
	require.Equal(t, len(ids), n)
	require.Equal(t, 3, batches)

	// The cancel's own event, then one republished event per purchase.
	records := kafkatest.ReadTopic(t, b.topic, time.Minute, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= len(ids)+1 })
	latest := map[string]int64{}
	hash := sarama.NewHashPartitioner(b.topic)
	for _, r := range records {
		ev, err := event.Parse(r.Value)
		require.NoError(t, err)
		require.Equal(t, ev.PurchaseId.String(), string(r.Key))
		want, err := hash.Partition(&sarama.ProducerMessage{Key: sarama.ByteEncoder(r.Key)}, 3)
		require.NoError(t, err)
		require.Equal(t, want, r.Partition, "purchase %s", ev.PurchaseId)
		require.GreaterOrEqual(t, ev.Version, latest[string(r.Key)], "purchase %s went back a version", ev.PurchaseId)
		latest[string(r.Key)] = ev.Version
	}
	require.Len(t, latest, len(ids))
	require.EqualValues(t, 2, latest[ids[0].String()], "the cancelled purchase is republished cancelled")
}
