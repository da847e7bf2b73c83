package kafkakit_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestBatchPublisher_PastItsTimeoutCutsTheProducerOffForGood: a Publish that
// Kafka does not answer within its timeout fails with ErrPublishTimeout,
// and what it was sending never reaches the topic, even when its send goes
// on afterwards; the next Publish connects anew and is on the topic.
func TestBatchPublisher_PastItsTimeoutCutsTheProducerOffForGood(t *testing.T) {
	t.Parallel()
	topic := kafkatest.Topic(t, 1)
	pub, err := kafkakit.NewBatchPublisher(kafkakit.BatchPublisherConfig{Cluster: kafkatest.Cluster(t), ClientID: "timeout-test",
		Marshaler: kafka.DefaultMarshaler{}, Timeout: 3 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	release := pub.HoldSends()
	err = pub.Publish(topic, message.NewMessage("late", []byte("late")))
	require.ErrorIs(t, err, kafkakit.ErrPublishTimeout)
	// The timed-out send goes on, on the producer that was cut off.
	require.Error(t, release(), "a producer cut off sends nothing")

	require.NoError(t, pub.Publish(topic, message.NewMessage("next", []byte("next"))))
	got := kafkatest.ReadTopic(t, topic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool {
		return len(ms) > 0 && kafkatest.Header(ms[len(ms)-1], kafka.UUIDHeaderKey) == "next"
	})
	require.Len(t, got, 1, "the timed-out batch never reached the topic")
}

// TestBatchPublisher_PastItsLeaseCutsTheProducerOff: no Publish starts once
// its lease has passed, and one under way when it passes fails with
// ErrLeaseExpired at once, its producer cut off, so that what it was
// sending never reaches the topic; once the lease is renewed, the next
// Publish connects anew and is on the topic.
func TestBatchPublisher_PastItsLeaseCutsTheProducerOff(t *testing.T) {
	t.Parallel()
	topic := kafkatest.Topic(t, 1)
	var until atomic.Int64
	renew := func(d time.Duration) { until.Store(time.Now().Add(d).UnixNano()) }
	renew(time.Minute)
	pub, err := kafkakit.NewBatchPublisher(kafkakit.BatchPublisherConfig{Cluster: kafkatest.Cluster(t), ClientID: "lease-test",
		Marshaler: kafka.DefaultMarshaler{}, Timeout: time.Minute, Lease: func() time.Time { return time.Unix(0, until.Load()) }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	require.NoError(t, pub.Publish(topic, message.NewMessage("first", []byte("first"))))

	release := pub.HoldSends()
	renew(300 * time.Millisecond)
	start := time.Now()
	err = pub.Publish(topic, message.NewMessage("late", []byte("late")))
	require.ErrorIs(t, err, kafkakit.ErrLeaseExpired)
	require.Less(t, time.Since(start), 5*time.Second, "the Publish ends when its lease does, not at its timeout")
	require.Error(t, release(), "a producer cut off sends nothing")
	require.ErrorIs(t, pub.Publish(topic, message.NewMessage("refused", []byte("refused"))), kafkakit.ErrLeaseExpired,
		"no Publish starts past the lease")

	renew(time.Minute)
	require.NoError(t, pub.Publish(topic, message.NewMessage("next", []byte("next"))))
	got := kafkatest.ReadTopic(t, topic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool {
		return len(ms) > 0 && kafkatest.Header(ms[len(ms)-1], kafka.UUIDHeaderKey) == "next"
	})
	var ids []string
	for _, m := range got {
		ids = append(ids, kafkatest.Header(m, kafka.UUIDHeaderKey))
	}
	require.Equal(t, []string{"first", "next"}, ids, "nothing of the Publish whose lease passed reached the topic")
}

// TestBatchPublisher_AFencedProducerIsReplacedOnlyWithinItsLease: two
// publishers of one transactional id take turns, as relay processes do at
// the outbox position; each turn's first Publish finds its producer fenced
// by the other's and publishes on a new one. Once its lease has passed, a
// fenced publisher fails instead, and fences no one.
func TestBatchPublisher_AFencedProducerIsReplacedOnlyWithinItsLease(t *testing.T) {
	t.Parallel()
	topic := kafkatest.Topic(t, 1)
	var until atomic.Int64
	until.Store(time.Now().Add(time.Hour).UnixNano())
	publisher := func(lease func() time.Time) *kafkakit.BatchPublisher {
		pub, err := kafkakit.NewBatchPublisher(kafkakit.BatchPublisherConfig{Cluster: kafkatest.Cluster(t), ClientID: "fenced-test",
			Marshaler: kafka.DefaultMarshaler{}, Lease: lease, TransactionalID: "fenced-test." + topic})
		require.NoError(t, err)
		t.Cleanup(func() { _ = pub.Close() })
		return pub
	}
	first := publisher(func() time.Time { return time.Unix(0, until.Load()) })
	second := publisher(nil)
	var want []string
	for i, pub := range []*kafkakit.BatchPublisher{first, second, first, second} {
		id := fmt.Sprintf("turn-%d", i)
		require.NoError(t, pub.Publish(topic, message.NewMessage(id, []byte(id))), "turn %d", i)
		want = append(want, id)
	}

	until.Store(time.Now().Add(-time.Second).UnixNano())
	require.ErrorIs(t, first.Publish(topic, message.NewMessage("late", []byte("late"))), kafkakit.ErrLeaseExpired)
	require.NoError(t, second.Publish(topic, message.NewMessage("last", []byte("last"))), "the late publisher fenced no one")
	want = append(want, "last")

	got := kafkatest.ReadTopic(t, topic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool {
		return len(ms) > 0 && kafkatest.Header(ms[len(ms)-1], kafka.UUIDHeaderKey) == "last"
	})
	var ids []string
	for _, m := range got {
		ids = append(ids, kafkatest.Header(m, kafka.UUIDHeaderKey))
	}
	require.Equal(t, want, ids, "each turn once, in order")
}

// TestBatchPublisher_APageIsCommittedWholeOrNotAtAll: the Publishes of a
// page are one Kafka transaction. A read_committed reader sees none of an
// aborted page, none of a page one of whose Publishes failed (its later
// Publishes and its commit fail with ErrPageAborted), and all of a
// committed one.
func TestBatchPublisher_APageIsCommittedWholeOrNotAtAll(t *testing.T) {
	t.Parallel()
	topic := kafkatest.Topic(t, 2)
	pub, err := kafkakit.NewBatchPublisher(kafkakit.BatchPublisherConfig{Cluster: kafkatest.Cluster(t), ClientID: "page-test",
		Marshaler: kafka.DefaultMarshaler{}, Timeout: 3 * time.Second, TransactionalID: "page-test." + topic})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	publish := func(ids ...string) error {
		msgs := make([]*message.Message, len(ids))
		for i, id := range ids {
			msgs[i] = message.NewMessage(id, []byte(id))
		}
		return pub.Publish(topic, msgs...)
	}

	pub.BeginPage()
	require.NoError(t, publish("aborted-1", "aborted-2"))
	require.NoError(t, publish("aborted-3"))
	require.NoError(t, pub.EndPage(false))

	pub.BeginPage()
	require.NoError(t, publish("failed-1"))
	release := pub.HoldSends()
	require.ErrorIs(t, publish("failed-2"), kafkakit.ErrPublishTimeout)
	require.ErrorIs(t, publish("failed-3"), kafkakit.ErrPageAborted, "a page whose publish failed publishes nothing more")
	require.ErrorIs(t, pub.EndPage(true), kafkakit.ErrPageAborted, "nor commits")
	_ = release()

	pub.BeginPage()
	require.NoError(t, publish("committed-1", "committed-2"))
	require.NoError(t, publish("committed-3"))
	require.NoError(t, pub.EndPage(true))
	require.NoError(t, publish("alone"), "outside a page, a Publish is a transaction of its own")

	// Until every committed record is read: the two partitions are read
	// side by side, and an aborted record precedes them in its partition.
	want := []string{"committed-1", "committed-2", "committed-3", "alone"}
	got := kafkatest.ReadTopic(t, topic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool {
		seen := map[string]bool{}
		for _, m := range ms {
			seen[kafkatest.Header(m, kafka.UUIDHeaderKey)] = true
		}
		for _, id := range want {
			if !seen[id] {
				return false
			}
		}
		return true
	})
	var ids []string
	for _, m := range got {
		ids = append(ids, kafkatest.Header(m, kafka.UUIDHeaderKey))
	}
	require.ElementsMatch(t, want, ids,
		"read_committed sees the committed page and the lone publish, nothing of the aborted or failed pages")
}
