package router_test

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

func TestCatalog_MalformedRecordGoesToDLQWithHeadersWhileThePartitionFlows(t *testing.T) {
	b := setupCatalog(t, true)
	project := uuid.New()
	b.ProjectCard(t, project)
	b.Start(t)

	// One key, so the bad record and the good one share a partition.
	ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetProject, project))
	bad := b.ProduceRaw(t, ev.PurchaseId.String(), []byte(`{"PurchaseId":"`+ev.PurchaseId.String()+`","Version":0}`))
	b.Produce(t, ev)
	b.WaitBoost(t, event.TargetProject, project, 10)

	dlq := kafkatest.ReadTopic(t, b.Cfg.DLQTopic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 1 })
	rec := dlq[0]
	require.Equal(t, bad.Payload, message.Payload(rec.Value), "the original bytes")
	require.Equal(t, bad.UUID, kafkatest.Header(rec, "_watermill_message_uuid"))
	require.Equal(t, "test", kafkatest.Header(rec, event.HeaderCorrelationID), "the original headers")
	require.Equal(t, middleware.CodeContractViolation, kafkatest.Header(rec, middleware.HeaderDLQErrorCode))
	require.Contains(t, kafkatest.Header(rec, middleware.HeaderDLQReason), "Version")
	require.Equal(t, b.Cfg.Topic, kafkatest.Header(rec, middleware.HeaderSourceTopic))
	require.NotEmpty(t, kafkatest.Header(rec, middleware.HeaderOriginalOffset))
	require.NotEmpty(t, kafkatest.Header(rec, middleware.HeaderOriginalPartition))
	require.Equal(t, 1.0, testutil.ToFloat64(b.Metrics.DLQ))
}

// TestCatalog_TombstoneIsANoOpCounted: a record with a null value (a
// producer's delete marker) under a purchase's key changes nothing, goes to
// no DLQ, is counted, and the valid record after it on its key applies.
func TestCatalog_TombstoneIsANoOpCounted(t *testing.T) {
	b := setupCatalog(t, true)
	project := uuid.New()
	b.ProjectCard(t, project)
	b.Start(t)

	ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetProject, project))
	p, err := sarama.NewSyncProducer(kafkatest.Brokers(t), kafkatest.Cluster(t).DurableProducerConfig("test"))
	require.NoError(t, err)
	defer p.Close()
	_, _, err = p.SendMessage(&sarama.ProducerMessage{Topic: b.Cfg.Topic, Key: sarama.StringEncoder(ev.PurchaseId.String()),
		Headers: []sarama.RecordHeader{{Key: []byte("_watermill_message_uuid"), Value: []byte(uuid.NewString())}}})
	require.NoError(t, err)
	b.Produce(t, ev)
	b.WaitBoost(t, event.TargetProject, project, 10)
	require.Equal(t, 1.0, testutil.ToFloat64(b.Metrics.Consumed.WithLabelValues("tombstone")))
	require.Zero(t, testutil.ToFloat64(b.Metrics.DLQ), "a tombstone is no dead letter")
}
