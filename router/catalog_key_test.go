package router_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/dlqreplay"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/router/rebuild"
)

// TestConsumer_KeyMustEqualPurchaseId: the purchase topic is compacted by
// key, so a valid event under any key but its PurchaseId (another id, the id
// in upper case; on the replay topic, no key, which a compacted topic
// refuses itself) is a contract violation: it is dead-lettered under its own
// key with the key_mismatch code and applies nothing, the rebuild skips it,
// and a DLQ replay sends it back with its key, to the DLQ again.
func TestConsumer_KeyMustEqualPurchaseId(t *testing.T) {
	b := setupCatalog(t, true)
	project := uuid.New()
	b.ProjectCard(t, project)
	b.Start(t)

	ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetProject, project))
	payload, err := json.Marshal(ev)
	require.NoError(t, err)
	keys := []string{uuid.NewString(), strings.ToUpper(ev.PurchaseId.String())}
	for _, key := range keys {
		b.ProduceRaw(t, key, payload)
	}
	produceWithoutKey(t, b.Cfg.ReplayTopic, payload)

	dead := kafkatest.ReadTopic(t, b.Cfg.DLQTopic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 3 })
	require.Len(t, dead, 3)
	got := map[string]bool{}
	for _, rec := range dead {
		require.Equal(t, middleware.CodeKeyMismatch, kafkatest.Header(rec, middleware.HeaderDLQErrorCode))
		require.Contains(t, kafkatest.Header(rec, middleware.HeaderDLQReason), ev.PurchaseId.String())
		require.Equal(t, payload, rec.Value, "the original bytes")
		got[string(rec.Key)] = rec.Key != nil
	}
	require.Equal(t, map[string]bool{keys[0]: true, keys[1]: true, "": false}, got, "each dead letter keeps its record's key")
	require.Zero(t, b.BoostOf(event.TargetProject, project), "a record keyed otherwise applies nothing")

	b.Produce(t, ev)
	b.WaitBoost(t, event.TargetProject, project, 10)

	rb, err := rebuild.New(rebuild.Config{DB: b.DB, Kafka: b.Cfg.Kafka, Topic: b.Cfg.Topic,
		Log: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(rb.Stop)
	st, err := rb.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, rebuild.StateDone, st.State)
	require.EqualValues(t, 3, st.Read)
	require.EqualValues(t, 2, st.Skipped, "the rebuild reads the keys and skips the records keyed otherwise")
	require.Equal(t, 10, b.BoostOf(event.TargetProject, project))

	res, err := dlqreplay.New(dlqreplay.Config{Kafka: b.Cfg.Kafka, DB: b.DB, DLQTopic: b.Cfg.DLQTopic, ReplayTopic: b.Cfg.ReplayTopic,
		SourceTopic: b.Cfg.Topic, Group: "pf-test-replay-" + kafkatest.RandomSuffix(), Log: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	replay, err := res.Run(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 3, replay.Replayed)
	again := kafkatest.ReadTopic(t, b.Cfg.DLQTopic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 6 })
	origins := map[string]string{}
	for _, rec := range dead {
		origins[string(rec.Key)] = kafkatest.Header(rec, middleware.HeaderSourceTopic) + "@" + kafkatest.Header(rec, middleware.HeaderOriginalOffset)
	}
	for _, rec := range again[3:] {
		require.Equal(t, origins[string(rec.Key)], kafkatest.Header(rec, middleware.HeaderSourceTopic)+"@"+kafkatest.Header(rec, middleware.HeaderOriginalOffset),
			"the first origin, kept across replays")
		require.Equal(t, middleware.CodeKeyMismatch, kafkatest.Header(rec, middleware.HeaderDLQErrorCode),
			"the replay keeps the key, so the consumer refuses it again")
	}
	require.Equal(t, 10, b.BoostOf(event.TargetProject, project))
}

// produceWithoutKey writes payload with the contract headers and a null key.
func produceWithoutKey(t *testing.T, topic string, payload []byte) {
	t.Helper()
	p, err := sarama.NewSyncProducer(kafkatest.Brokers(t), kafkatest.Cluster(t).DurableProducerConfig("test"))
	require.NoError(t, err)
	defer p.Close()
	_, _, err = p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.ByteEncoder(payload),
		Headers: []sarama.RecordHeader{{Key: []byte("_watermill_message_uuid"), Value: []byte(uuid.NewString())},
			{Key: []byte(event.HeaderContractVersion), Value: []byte(event.ContractVersion)}}})
	require.NoError(t, err)
}
