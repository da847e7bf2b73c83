package router_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestCatalog_OversizedMessageIdAppliesOnce: the dedup mark is a digest, so
// a MessageId of any size (none, a UUID, 3 KB, 64 KB: longer than a btree
// index row holds) is stored. Each record, delivered twice, applies once,
// and the next record of its purchase, on the same key, applies after it.
func TestCatalog_OversizedMessageIdAppliesOnce(t *testing.T) {
	b := setupCatalog(t, true)
	sizes := []int{0, 36, 3 << 10, 64 << 10}
	projects := make([]uuid.UUID, len(sizes))
	for i := range projects {
		projects[i] = uuid.New()
		b.ProjectCard(t, projects[i])
	}
	b.Start(t)
	p := rawProducer(t)

	for i, size := range sizes {
		first := catalogtest.PurchaseEvent(event.StatusActive, 1, 10+i, catalogtest.Target(event.TargetProject, projects[i]))
		id := messageIDOf(t, size)
		produceRecord(t, p, b.Cfg.Topic, id, first)
		produceRecord(t, p, b.Cfg.Topic, id, first)
		next := first
		next.Version, next.BoostWeight = 2, 50+i
		produceRecord(t, p, b.Cfg.Topic, uuid.NewString(), next)
	}

	for i := range sizes {
		b.WaitBoost(t, event.TargetProject, projects[i], 50+i)
	}
	applied, duplicate := b.Metrics.Consumed.WithLabelValues("applied"), b.Metrics.Consumed.WithLabelValues("duplicate")
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(applied) == float64(2*len(sizes)) && testutil.ToFloat64(duplicate) == float64(len(sizes))
	}, 10*time.Second, 10*time.Millisecond, "each record applies once and its redelivery is a duplicate: applied %v, duplicates %v",
		testutil.ToFloat64(applied), testutil.ToFloat64(duplicate))
	require.Zero(t, testutil.ToFloat64(b.Metrics.DLQ), "a valid event is never dead-lettered for its MessageId")
	require.Zero(t, testutil.ToFloat64(b.Metrics.MessageIDReused))
	var marks int
	require.NoError(t, b.DB.Get(&marks, `SELECT count(*) FROM catalog.processed_records`))
	require.Equal(t, 2*len(sizes), marks, "one dedup mark per distinct record")
}

// TestCatalog_ReusedMessageIdIsAppliedByTheVersionGuardAndCounted: a
// MessageId that comes back with another payload is a new record: a newer
// version applies, an older one is stale, and both are counted as reused;
// the same bytes again are a duplicate.
func TestCatalog_ReusedMessageIdIsAppliedByTheVersionGuardAndCounted(t *testing.T) {
	b := setupCatalog(t, true)
	project := uuid.New()
	b.ProjectCard(t, project)
	b.Start(t)
	p := rawProducer(t)
	id := uuid.NewString()

	v2 := catalogtest.PurchaseEvent(event.StatusActive, 2, 10, catalogtest.Target(event.TargetProject, project))
	produceRecord(t, p, b.Cfg.Topic, id, v2)
	b.WaitBoost(t, event.TargetProject, project, 10)

	v3 := v2
	v3.Version, v3.BoostWeight = 3, 30
	produceRecord(t, p, b.Cfg.Topic, id, v3)
	b.WaitBoost(t, event.TargetProject, project, 30)

	v1 := v2
	v1.Version, v1.BoostWeight = 1, 70
	produceRecord(t, p, b.Cfg.Topic, id, v1)
	produceRecord(t, p, b.Cfg.Topic, id, v3)
	b.WaitConsumed(t, 4, 30*time.Second)

	require.Equal(t, 30, b.BoostOf(event.TargetProject, project), "the older version is stale")
	require.Equal(t, 2.0, testutil.ToFloat64(b.Metrics.MessageIDReused), "v3 and v1 reused v2's MessageId")
	require.Equal(t, 1.0, testutil.ToFloat64(b.Metrics.Stale))
	require.Equal(t, 2.0, testutil.ToFloat64(b.Metrics.Consumed.WithLabelValues("applied")))
	require.Equal(t, 1.0, testutil.ToFloat64(b.Metrics.Consumed.WithLabelValues("duplicate")), "v3's bytes again")
}

// rawProducer writes records as they are given, headers included.
func rawProducer(t *testing.T) sarama.SyncProducer {
	t.Helper()
	p, err := sarama.NewSyncProducer(kafkatest.Brokers(t), kafkatest.Cluster(t).DurableProducerConfig("test-raw"))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
	return p
}

// produceRecord writes ev to topic under its PurchaseId, with the contract
// headers and messageID as its MessageId header, whatever its size.
func produceRecord(t *testing.T, p sarama.SyncProducer, topic, messageID string, ev event.PurchaseChanged) {
	t.Helper()
	payload, err := json.Marshal(ev)
	require.NoError(t, err)
	_, _, err = p.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(ev.PurchaseId.String()),
		Value: sarama.ByteEncoder(payload),
		Headers: []sarama.RecordHeader{{Key: []byte(kafka.UUIDHeaderKey), Value: []byte(messageID)},
			{Key: []byte(event.HeaderContractVersion), Value: []byte(event.ContractVersion)},
			{Key: []byte(event.HeaderAggregateID), Value: []byte(ev.PurchaseId.String())}}})
	require.NoError(t, err, "produce a record with a MessageId of %d bytes", len(messageID))
}

// messageIDOf is a MessageId of size bytes: a UUID at 36, otherwise random
// hex, which PostgreSQL cannot compress into an index row.
func messageIDOf(t *testing.T, size int) string {
	t.Helper()
	if size == 36 {
		return uuid.NewString()
	}
	raw := make([]byte, (size+1)/2)
	_, err := rand.Read(raw)
	require.NoError(t, err)
	id := hex.EncodeToString(raw)[:size]
	require.Len(t, id, size, fmt.Sprintf("a MessageId of %d bytes", size))
	return id
}
