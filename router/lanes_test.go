package router_test

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestLanes_APartitionsPurchasesGoSideBySideEachInOrderAndTheOffsetWaits:
// one partition holds the records of 13 purchases, interleaved. The
// handler holds the partition's first record. The records of other
// purchases are handled meanwhile (lanes), the held purchase's next record
// is not (its lane keeps its order), and the group's committed offset does
// not pass the held record, so a crash would deliver it again. Once it is
// acked, every purchase was handled in its own order and the offset is the
// partition's end.
func TestLanes_APartitionsPurchasesGoSideBySideEachInOrderAndTheOffsetWaits(t *testing.T) {
	t.Parallel()
	const keys, perKey = 13, 20
	topic := kafkatest.Topic(t, 1)
	group := "pf-test-" + kafkatest.RandomSuffix()
	pub := kafkaPublisherKeyed(t, func(m *message.Message) string { return m.Metadata.Get("key") })
	var msgs []*message.Message
	for seq := range perKey {
		for k := range keys {
			msg := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(seq)))
			msg.Metadata.Set("key", fmt.Sprintf("purchase-%02d", k))
			msgs = append(msgs, msg)
		}
	}
	require.NoError(t, pub.Publish(topic, msgs...))

	hold := make(chan struct{})
	var mu sync.Mutex
	seen := map[string][]int{} // key → seqs in the order handled
	others := 0                // records of other purchases handled while the first was held
	held := true
	runMemberWith(t, topic, group, router.ConsumerBuffers{Lanes: 8}, nil, nil, func(msg *message.Message) error {
		key, _ := kafka.MessageKeyFromCtx(msg.Context())
		seq, err := strconv.Atoi(string(msg.Payload))
		require.NoError(t, err)
		if offset, _ := kafka.MessagePartitionOffsetFromCtx(msg.Context()); offset == 0 {
			<-hold
		}
		mu.Lock()
		defer mu.Unlock()
		seen[string(key)] = append(seen[string(key)], seq)
		if held && string(key) != "purchase-00" {
			others++
		}
		return nil
	})

	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return others >= keys }, 30*time.Second, 10*time.Millisecond,
		"no record of another purchase was handled while the partition's first record was held: its records go one at a time")
	admin, err := sarama.NewClusterAdmin(kafkatest.Brokers(t), kafkatest.Cluster(t).ClientConfig("test-admin"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	committed := func() int64 {
		resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: {0}})
		require.NoError(t, err)
		if b := resp.GetBlock(topic, 0); b != nil {
			return b.Offset
		}
		return -1
	}
	// Sarama commits what is marked every second.
	require.Never(t, func() bool { return committed() > 0 }, 3*time.Second, 100*time.Millisecond,
		"the committed offset passed a record not yet acked: a crash now would lose it")
	mu.Lock()
	require.Empty(t, seen["purchase-00"], "the held purchase's next record was handled before the first")
	held = false
	mu.Unlock()
	close(hold)

	require.Eventually(t, func() bool { return committed() == keys*perKey }, 30*time.Second, 50*time.Millisecond,
		"the committed offset did not reach the partition's end once every record was acked")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, keys)
	for key, seqs := range seen {
		want := make([]int, perKey)
		for i := range want {
			want[i] = i
		}
		require.Equal(t, want, seqs, "purchase %s was handled out of its order", key)
	}
}

// TestLanes_AtMostInFlightRecordsAreOutAtOnce: over every partition of the
// subscriber, no more records are handed to lanes and not acked than
// InFlight, however many lanes and partitions have records waiting; once
// the handler returns, the rest follow.
func TestLanes_AtMostInFlightRecordsAreOutAtOnce(t *testing.T) {
	t.Parallel()
	const records, inFlight = 200, 5
	topic := kafkatest.Topic(t, 4)
	pub := kafkaPublisherOf(t) // keyed by message id: every record a purchase of its own
	var msgs []*message.Message
	for range records {
		msgs = append(msgs, message.NewMessage(watermill.NewUUID(), []byte(`{}`)))
	}
	require.NoError(t, pub.Publish(topic, msgs...))

	release := make(chan struct{})
	var mu sync.Mutex
	now, most, handled := 0, 0, 0
	runMemberWith(t, topic, "pf-test-"+kafkatest.RandomSuffix(), router.ConsumerBuffers{Lanes: 8, InFlight: inFlight}, nil, nil,
		func(*message.Message) error {
			mu.Lock()
			now++
			most = max(most, now)
			mu.Unlock()
			<-release
			mu.Lock()
			now--
			handled++
			mu.Unlock()
			return nil
		})
	state := func() (int, int) { mu.Lock(); defer mu.Unlock(); return now, most }
	require.Eventually(t, func() bool { n, _ := state(); return n >= inFlight }, 30*time.Second, 10*time.Millisecond,
		"the handler never held %d records at once", inFlight)
	require.Never(t, func() bool { _, m := state(); return m > inFlight }, time.Second, 10*time.Millisecond,
		"more records than InFlight were out at once")
	close(release)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return handled == records }, 30*time.Second, 10*time.Millisecond,
		"not every record was handled once the handler returned")
	_, m := state()
	require.Equal(t, inFlight, m, "the most records out at once")
}
