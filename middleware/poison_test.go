package middleware_test

import (
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/logtest"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

func TestPoisonQueue_KeepsOriginalBytesAndHeadersAndAddsDLQHeaders(t *testing.T) {
	t.Parallel()
	source, dlqTopic := kafkatest.Topic(t, 1), kafkatest.Topic(t, 1)
	logs := &logtest.Logs{}
	var deadLettered atomic.Int32
	poison, err := middleware.PoisonQueue(
		kafkaPublisher(t, kafka.NewWithPartitioningMarshaler(middleware.DLQPartitionKey)),
		middleware.PoisonConfig{
			Topic:        dlqTopic,
			Logger:       logs.Logger(),
			OnDeadLetter: func(*message.Message, *middleware.Permanent) { deadLettered.Add(1) },
		})
	require.NoError(t, err)
	retry, err := middleware.Retry(middleware.RetryConfig{
		IsConflict: func(error) bool { return false },
		Logger:     logs.Logger(),
	})
	require.NoError(t, err)

	var mu sync.Mutex
	var applied []string
	runConsumer(t, source, func(msg *message.Message) error {
		if _, err := event.Parse(msg.Payload); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		applied = append(applied, msg.UUID)
		return nil
	}, poison, retry)

	// A payload that breaks the contract, then a healthy event behind it on the
	// same partition.
	purchaseID := uuid.NewString()
	bad := message.NewMessage(watermill.NewUUID(), []byte(`{"PurchaseId":"`+purchaseID+`","BoostWeight":0,`))
	bad.Metadata.Set(event.HeaderContractVersion, event.ContractVersion)
	bad.Metadata.Set(event.HeaderEventType, event.EventType)
	bad.Metadata.Set(event.HeaderAggregateID, purchaseID)
	bad.Metadata.Set(event.HeaderCorrelationID, "corr-1")
	bad.Metadata.Set("x-custom", "kept as is")
	// Any producer may write the DLQ's origin headers on the purchase topic:
	// a record not read from the replay topic gets its real origin.
	spoofed := map[string]string{middleware.HeaderSourceTopic: "pin.someone-else", middleware.HeaderOriginalPartition: "7",
		middleware.HeaderOriginalOffset: "999999"}
	for key, value := range spoofed {
		bad.Metadata.Set(key, value)
	}
	good, err := event.NewMessage(validEvent(), "corr-2", time.Now())
	require.NoError(t, err)
	src := kafkaPublisher(t, kafka.DefaultMarshaler{})
	require.NoError(t, src.Publish(source, bad))
	require.NoError(t, src.Publish(source, good))

	dead := kafkatest.ReadTopic(t, dlqTopic, time.Minute, func(got []*sarama.ConsumerMessage) bool { return len(got) == 1 })[0]
	original := kafkatest.ReadTopic(t, source, 10*time.Second, func(got []*sarama.ConsumerMessage) bool { return len(got) == 2 })[0]

	require.Equal(t, original.Value, dead.Value, "the record value is the original bytes")
	require.Equal(t, bad.UUID, kafkatest.Header(dead, kafka.UUIDHeaderKey), "the same message UUID")
	for key, value := range bad.Metadata {
		if _, ok := spoofed[key]; !ok {
			require.Equal(t, value, kafkatest.Header(dead, key), "original header %s", key)
		}
	}
	require.Equal(t, middleware.CodeContractViolation, kafkatest.Header(dead, middleware.HeaderDLQErrorCode))
	require.Contains(t, kafkatest.Header(dead, middleware.HeaderDLQReason), "malformed JSON")
	require.Equal(t, source, kafkatest.Header(dead, middleware.HeaderSourceTopic), "the real origin, not the producer's headers")
	require.Equal(t, strconv.Itoa(int(original.Partition)), kafkatest.Header(dead, middleware.HeaderOriginalPartition))
	require.Equal(t, strconv.FormatInt(original.Offset, 10), kafkatest.Header(dead, middleware.HeaderOriginalOffset))
	require.Equal(t, purchaseID, string(dead.Key), "keyed by purchase for an ordered replay")

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(applied) == 1 && applied[0] == good.UUID
	}, 30*time.Second, 10*time.Millisecond, "the partition keeps flowing past the dead letter")
	require.EqualValues(t, 1, deadLettered.Load())
	logged := logs.Find(slog.LevelError, "dead-lettered")
	require.Len(t, logged, 1)
	require.Equal(t, bad.UUID, logged[0]["MessageId"])
	require.Equal(t, purchaseID, logged[0]["PurchaseId"])
	require.Equal(t, middleware.CodeContractViolation, logged[0]["code"])
	require.Empty(t, logs.Find(slog.LevelWarn, "retrying"), "a contract violation is not retried")
}

func TestPoisonQueue_PublishFailureNacksInsteadOfDropping(t *testing.T) {
	t.Parallel()
	brokerDown := errors.New("kafka: client has run out of available brokers")
	logs := &logtest.Logs{}
	var deadLettered atomic.Int32
	poison, err := middleware.PoisonQueue(&recordingPublisher{err: brokerDown}, middleware.PoisonConfig{
		Logger:       logs.Logger(),
		OnDeadLetter: func(*message.Message, *middleware.Permanent) { deadLettered.Add(1) },
	})
	require.NoError(t, err)

	_, err = poison(func(*message.Message) ([]*message.Message, error) {
		return nil, &middleware.Permanent{Code: middleware.CodeContractViolation, Reason: "bad", Err: errors.New("bad")}
	})(newMessage(t))

	require.ErrorIs(t, err, brokerDown, "the router nacks the message and it is delivered again")
	var perm *middleware.Permanent
	require.False(t, errors.As(err, &perm), "a failed dead-letter is not itself dead-lettered")
	require.Zero(t, deadLettered.Load())
	require.Empty(t, logs.Find(slog.LevelError, "dead-lettered"))
}

func TestPoisonQueue_NonPermanentErrorPassesThroughUnchanged(t *testing.T) {
	t.Parallel()
	pub := &recordingPublisher{}
	poison, err := middleware.PoisonQueue(pub, middleware.PoisonConfig{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	infra := errors.New("connection reset by peer")

	_, err = poison(func(*message.Message) ([]*message.Message, error) { return nil, infra })(newMessage(t))

	require.Equal(t, infra, err)
	require.Empty(t, pub.published())
}

func TestDLQPartitionKey_FallsBackToMessageUUIDWithoutPurchaseHeader(t *testing.T) {
	t.Parallel()
	msg := newMessage(t)
	key, err := middleware.DLQPartitionKey("", msg)
	require.NoError(t, err)
	require.Equal(t, msg.Metadata.Get(event.HeaderAggregateID), key)

	delete(msg.Metadata, event.HeaderAggregateID)
	key, err = middleware.DLQPartitionKey("", msg)
	require.NoError(t, err)
	require.Equal(t, msg.UUID, key)
}

func validEvent() event.PurchaseChanged {
	now := time.Now().UTC()
	return event.PurchaseChanged{
		PurchaseId:  uuid.New(),
		TenantId:    uuid.New(),
		PackageKind: "Standard",
		Targets:     []event.Target{{TargetKind: event.TargetProject, TargetId: uuid.New()}},
		BoostWeight: 10,
		Status:      event.StatusActive,
		StartsAt:    now,
		EndsAt:      now.Add(time.Hour),
		Version:     1,
	}
}

func TestPoisonQueue_ConfigRefusesATopicKafkaWouldRefuse(t *testing.T) {
	t.Parallel()
	_, err := middleware.PoisonQueue(&recordingPublisher{}, middleware.PoisonConfig{Topic: "dead letters"})
	require.ErrorContains(t, err, "is not a Kafka topic name")
}
