package router_test

import (
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestRelay_PartialFailureResendsOnlyTheFailedEvents: Kafka itself refuses
// part of a merged group of outbox rows: the topic takes records of at most
// 16 KiB, and one event of the group is far larger, so the batch of its
// partition is refused (MESSAGE_TOO_LARGE) while the other partitions take
// theirs. Every resend publishes only what Kafka has not acknowledged yet.
// Once the topic takes large records again, every event is on the topic
// exactly once.
func TestRelay_PartialFailureResendsOnlyTheFailedEvents(t *testing.T) {
	t.Parallel()
	b := promotionBundle{db: pgtest.DB(t), topic: kafkatest.TopicConfigured(t, 3, map[string]string{"max.message.bytes": "16384"})}
	var txs [][]*message.Message
	for i := range 21 {
		if i == 10 {
			txs = append(txs, []*message.Message{wideEvent(t, 1000)})
			continue
		}
		txs = append(txs, purchaseEvents(t, 1, "relay-partial"))
	}
	wide := txs[10][0]
	var all []*message.Message
	for _, tx := range txs {
		all = append(all, tx...)
	}
	// Every row visible at once, so the relay merges them into one message.
	gate := b.db.MustBegin()
	gate.MustExec(`SELECT pg_current_xact_id()`)
	writeOutbox(t, b, txs...)
	kp, err := kafkakit.NewBatchPublisher(kafkakit.BatchPublisherConfig{Cluster: kafkatest.Cluster(t), ClientID: "relay-test",
		Marshaler: kafka.NewWithPartitioningMarshaler(event.PartitionKey)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = kp.Close() })
	calls := &callRecorder{Publisher: kp}
	b.startRouter(t, router.PromotionConfig{RelayPublisher: calls, RelayPublishTimeout: 2 * time.Second,
		RelayStepBack: quickStepBack}, expire.Config{Interval: time.Hour}, slog.New(slog.DiscardHandler))
	require.NoError(t, gate.Commit())

	require.Eventually(t, func() bool { return len(calls.Calls()) >= 3 }, time.Minute, 10*time.Millisecond,
		"the relay sent the group and resent it twice")
	refusing := calls.Calls()
	require.Equal(t, uuidsOf(all), refusing[0].sent, "the rows went to Kafka as one merged group, in commit order")
	require.Less(t, len(refusing[0].refused), len(all), "Kafka took part of the group")
	acked := map[string]bool{}
	for i, c := range refusing {
		require.Contains(t, c.refused, wide.UUID, "call %d: Kafka refuses the record too large for the topic", i)
		for _, id := range c.sent {
			require.False(t, acked[id], "call %d resent event %s, which Kafka had acknowledged", i, id)
		}
		if i > 0 {
			require.Subset(t, c.sent, slices.Collect(maps.Keys(refusing[i-1].refused)), "call %d resent every refused event", i)
		}
		for _, id := range c.sent {
			acked[id] = !c.refused[id]
		}
	}
	onTopic := readEachOnce(t, b.topic, len(all)-len(refusing[len(refusing)-1].refused))
	require.NotContains(t, onTopic, wide.UUID)

	kafkatest.SetTopicConfig(t, b.topic, "max.message.bytes", "1048588")
	onTopic = readEachOnce(t, b.topic, len(all))
	require.ElementsMatch(t, uuidsOf(all), onTopic)
	require.EqualValues(t, len(all), catalogtest.TopicSize(t, b.topic), "no extra record on the topic")
	// The records are on the topic a moment before their Publish call
	// returns and is recorded.
	require.Eventually(t, func() bool {
		last := calls.Calls()
		return len(last[len(last)-1].refused) == 0
	}, time.Minute, 10*time.Millisecond, "the last send went through")
}

// readEachOnce reads the topic until it holds n distinct events, checks that
// none of those read is there twice, and returns their MessageIds.
func readEachOnce(t *testing.T, topic string, n int) []string {
	t.Helper()
	distinct := func(ms []*sarama.ConsumerMessage) map[string]int {
		seen := map[string]int{}
		for _, m := range ms {
			seen[kafkatest.Header(m, kafka.UUIDHeaderKey)]++
		}
		return seen
	}
	records := kafkatest.ReadTopic(t, topic, time.Minute, func(ms []*sarama.ConsumerMessage) bool { return len(distinct(ms)) >= n })
	seen := distinct(records)
	for id, k := range seen {
		require.Equal(t, 1, k, "event %s is on the topic %d times", id, k)
	}
	return slices.Collect(maps.Keys(seen))
}

// wideEvent is the first event of a purchase of n property-object targets.
func wideEvent(t testing.TB, n int) *message.Message {
	t.Helper()
	ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 10)
	for range n {
		ev.Targets = append(ev.Targets, catalogtest.Target(event.TargetPropertyObject, uuid.New()))
	}
	msg, err := event.NewMessage(ev, "relay-partial", time.Now())
	require.NoError(t, err)
	return msg
}

// callRecorder is the relay's Kafka publisher, recording what each call sent
// and which of it Kafka refused.
type callRecorder struct {
	message.Publisher

	mu    sync.Mutex
	calls []publishCall
}

type publishCall struct {
	sent    []string
	refused map[string]bool
}

func (r *callRecorder) Publish(topic string, msgs ...*message.Message) error {
	err := r.Publisher.Publish(topic, msgs...)
	c := publishCall{sent: uuidsOf(msgs), refused: map[string]bool{}}
	var be *kafkakit.BatchError
	switch {
	case errors.As(err, &be):
		for id := range be.Failed {
			c.refused[id] = true
		}
	case err != nil:
		for _, id := range c.sent {
			c.refused[id] = true
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
	return err
}

// Calls are the calls so far, in order.
func (r *callRecorder) Calls() []publishCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}
