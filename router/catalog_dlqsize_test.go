package router_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strconv"
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
)

// topicLimit is the max.message.bytes of the test's purchase topic and DLQ.
const topicLimit = 64 << 10

func TestCatalog_RecordTooLargeForTheDLQIsDeadLetteredByReference(t *testing.T) {
	b := setupCatalog(t, true)
	limit := strconv.Itoa(topicLimit)
	b.Cfg.Topic = kafkatest.TopicConfigured(t, 3, map[string]string{"max.message.bytes": limit, "cleanup.policy": "compact"})
	b.Cfg.DLQTopic = kafkatest.TopicConfigured(t, 1, map[string]string{"max.message.bytes": limit})
	project := uuid.New()
	b.ProjectCard(t, project)
	b.Start(t)

	// An invalid record as large as the topic takes: with the x-dlq headers
	// its dead letter would not fit the DLQ.
	ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetProject, project))
	key := ev.PurchaseId.String()
	producer, err := sarama.NewSyncProducer(kafkatest.Brokers(t), kafkatest.Cluster(t).DurableProducerConfig("test"))
	require.NoError(t, err)
	defer producer.Close()
	rec := &sarama.ProducerMessage{Topic: b.Cfg.Topic, Key: sarama.StringEncoder(key), Headers: []sarama.RecordHeader{
		{Key: []byte("_watermill_message_uuid"), Value: []byte(uuid.NewString())},
		{Key: []byte(event.HeaderContractVersion), Value: []byte(event.ContractVersion)},
		{Key: []byte(event.HeaderAggregateID), Value: []byte(key)},
		{Key: []byte(event.HeaderCorrelationID), Value: []byte("test")},
	}}
	prefix := `{"PurchaseId":"` + key + `","Version":0,"Padding":"`
	// 61 bytes of batch header, and Sarama's widest estimate of the record.
	padding := topicLimit - 61 - rec.ByteSize(2) - len(prefix) - len(`"}`)
	value := []byte(prefix + strings.Repeat("x", padding) + `"}`)
	rec.Value = sarama.ByteEncoder(value)
	partition, offset, err := producer.SendMessage(rec)
	require.NoError(t, err, "the record fits its topic")
	b.Produce(t, ev)

	require.Eventually(t, func() bool { return b.BoostOf(event.TargetProject, project) == 10 }, 15*time.Second, 10*time.Millisecond,
		"the valid record after the too large one on its key applies; boost is %d", b.BoostOf(event.TargetProject, project))
	dlq := kafkatest.ReadTopic(t, b.Cfg.DLQTopic, 10*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 1 })
	ref := dlq[0]
	sum := sha256.Sum256(value)
	require.Equal(t, "true", kafkatest.Header(ref, middleware.HeaderDLQByReference))
	require.Empty(t, ref.Value, "a dead letter by reference carries no value")
	require.Equal(t, key, string(ref.Key))
	require.Equal(t, hex.EncodeToString(sum[:]), kafkatest.Header(ref, middleware.HeaderDLQValueSHA256))
	require.Equal(t, strconv.Itoa(len(value)), kafkatest.Header(ref, middleware.HeaderDLQValueSize))
	require.Equal(t, b.Cfg.Topic, kafkatest.Header(ref, middleware.HeaderSourceTopic))
	require.Equal(t, strconv.Itoa(int(partition)), kafkatest.Header(ref, middleware.HeaderOriginalPartition))
	require.Equal(t, strconv.FormatInt(offset, 10), kafkatest.Header(ref, middleware.HeaderOriginalOffset))
	require.Equal(t, middleware.CodeContractViolation, kafkatest.Header(ref, middleware.HeaderDLQErrorCode))
	require.Contains(t, kafkatest.Header(ref, middleware.HeaderDLQReason), "Version")

	// The replay fetches the record from its topic, checks its hash and
	// forwards it whole; the consumer dead-letters it again, by reference
	// to its first origin, which every copy keeps.
	cfg := dlqreplay.Config{Kafka: b.Cfg.Kafka, DB: b.DB, DLQTopic: b.Cfg.DLQTopic, ReplayTopic: b.Cfg.ReplayTopic, SourceTopic: b.Cfg.Topic,
		Group: "pf-test-replay-" + kafkatest.RandomSuffix(), Log: slog.New(slog.DiscardHandler)}
	res := replayDLQ(t, cfg)
	require.EqualValues(t, 1, res.Replayed, "%+v", res.Counts)
	require.Zero(t, res.Skipped)
	replayed := kafkatest.ReadTopic(t, b.Cfg.ReplayTopic, 10*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 1 })
	require.Equal(t, value, replayed[0].Value, "the record itself is replayed")
	require.Equal(t, key, string(replayed[0].Key))
	require.Equal(t, "1", kafkatest.Header(replayed[0], middleware.HeaderDLQReplayCount))
	require.Equal(t, middleware.CodeContractViolation, kafkatest.Header(replayed[0], middleware.HeaderDLQErrorCode))
	require.Empty(t, kafkatest.Header(replayed[0], middleware.HeaderDLQByReference))
	dlq = kafkatest.ReadTopic(t, b.Cfg.DLQTopic, 10*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 2 })
	require.Equal(t, b.Cfg.Topic, kafkatest.Header(dlq[1], middleware.HeaderSourceTopic))
	require.Equal(t, strconv.FormatInt(offset, 10), kafkatest.Header(dlq[1], middleware.HeaderOriginalOffset))
	require.Equal(t, "true", kafkatest.Header(dlq[1], middleware.HeaderDLQByReference))

	// A reference whose hash no longer matches (a newer record under the
	// offset) is reported and skipped, never replaced by another record.
	superseded := &sarama.ProducerMessage{Topic: b.Cfg.DLQTopic, Key: sarama.StringEncoder(key), Value: sarama.ByteEncoder{}}
	for _, h := range ref.Headers {
		v := h.Value
		if string(h.Key) == middleware.HeaderDLQValueSHA256 {
			v = []byte(strings.Repeat("0", 64))
		}
		superseded.Headers = append(superseded.Headers, sarama.RecordHeader{Key: h.Key, Value: v})
	}
	_, _, err = producer.SendMessage(superseded)
	require.NoError(t, err)
	cfg.Force = true // past the ledger, which has this original replayed
	res = replayDLQ(t, cfg)
	require.EqualValues(t, 1, res.Replayed, "the copy's reference still finds its record: %+v", res.Counts)
	require.EqualValues(t, 1, res.Skipped, "%+v", res.Counts)
	replayed = kafkatest.ReadTopic(t, b.Cfg.ReplayTopic, 10*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 2 })
	require.Equal(t, value, replayed[1].Value, "the record itself, never another")
	require.EqualValues(t, 2, catalogtest.TopicSize(t, b.Cfg.ReplayTopic), "nothing else replayed")
}

// replayDLQ runs one replay and fails the test unless it ends by itself.
func replayDLQ(t *testing.T, cfg dlqreplay.Config) dlqreplay.Result {
	t.Helper()
	r, err := dlqreplay.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := r.Run(ctx)
	require.NoError(t, err)
	return res
}
