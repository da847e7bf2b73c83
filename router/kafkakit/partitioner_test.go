package kafkakit_test

import (
	"strconv"
	"testing"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit"
)

// TestPinnedHashPartitioner_SamePartitionAsSaramasHashForEveryKey: over the
// pinned count, every key goes where sarama.NewHashPartitioner sends it at
// that count, whatever count the topic has now; a topic with fewer
// partitions than pinned is refused.
func TestPinnedHashPartitioner_SamePartitionAsSaramasHashForEveryKey(t *testing.T) {
	const topic = "purchases"
	for _, pinned := range []int32{1, 2, 3, 7, 48} {
		pin := kafkakit.PinnedHashPartitioner(func(string) int32 { return pinned })(topic)
		def := sarama.NewHashPartitioner(topic)
		require.True(t, pin.RequiresConsistency())
		for i := range 20000 {
			key := uuid.New().String()
			if i%10 == 0 {
				key = strconv.Itoa(i) // short keys too
			}
			msg := &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(key)}
			want, err := def.Partition(msg, pinned)
			require.NoError(t, err)
			for _, now := range []int32{pinned, pinned + 1, 2 * pinned, pinned + 50} {
				got, err := pin.Partition(msg, now)
				require.NoError(t, err)
				require.Equal(t, want, got, "key %q, pinned %d, topic has %d", key, pinned, now)
			}
		}
		if pinned > 1 {
			_, err := pin.Partition(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder("k")}, pinned-1)
			require.ErrorIs(t, err, kafkakit.ErrFewerPartitions)
		}
	}
	// No pin: the topic's current count, as Sarama does.
	unpinned := kafkakit.PinnedHashPartitioner(func(string) int32 { return 0 })(topic)
	msg := &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(uuid.NewString())}
	want, _ := sarama.NewHashPartitioner(topic).Partition(msg, 5)
	got, err := unpinned.Partition(msg, 5)
	require.NoError(t, err)
	require.Equal(t, want, got)
}
