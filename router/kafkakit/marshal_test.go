package kafkakit_test

import (
	"cmp"
	"errors"
	"slices"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit"
)

func byAggregate(_ string, msg *message.Message) (string, error) {
	if k := msg.Metadata.Get("aggregate_id"); k != "" {
		return k, nil
	}
	return "", errors.New("no aggregate_id")
}

// TestKeyedMarshaler_WritesWhatTheDefaultWrites: the record of a message
// has the key, value and headers that watermill-kafka's partitioning
// marshaler gives it, for 0 to 20 metadata pairs (past every power of two
// the default's headers grow through), and its own errors: a reserved
// header, a key that cannot be made. Its records read back as the message.
func TestKeyedMarshaler_WritesWhatTheDefaultWrites(t *testing.T) {
	t.Parallel()
	ours := kafkakit.KeyedMarshaler{Key: byAggregate}
	theirs := kafka.NewWithPartitioningMarshaler(byAggregate)
	for pairs := range 21 {
		msg := message.NewMessage("uuid-1", []byte(`{"a":1}`))
		msg.Metadata.Set("aggregate_id", "purchase-1")
		for i := range pairs {
			msg.Metadata.Set(string(rune('a'+i))+"-key", string(rune('A'+i))+"-value")
		}
		want, err := theirs.Marshal("topic", msg)
		require.NoError(t, err)
		got, err := ours.Marshal("topic", msg)
		require.NoError(t, err)
		require.Equal(t, "topic", got.Topic)
		require.Equal(t, encoded(t, want.Key), encoded(t, got.Key), "key, %d pairs", pairs)
		require.Equal(t, encoded(t, want.Value), encoded(t, got.Value), "value, %d pairs", pairs)
		require.Equal(t, sortedHeaders(want.Headers), sortedHeaders(got.Headers), "headers, %d pairs", pairs)

		back, err := ours.Unmarshal(&sarama.ConsumerMessage{Key: encoded(t, got.Key), Value: encoded(t, got.Value),
			Headers: pointers(got.Headers)})
		require.NoError(t, err)
		require.Equal(t, msg.UUID, back.UUID)
		require.Equal(t, msg.Payload, back.Payload)
		require.Equal(t, msg.Metadata, back.Metadata)
	}

	reserved := message.NewMessage("uuid-2", nil)
	reserved.Metadata.Set(kafka.UUIDHeaderKey, "x")
	reserved.Metadata.Set("aggregate_id", "purchase-2")
	_, err := ours.Marshal("topic", reserved)
	require.ErrorContains(t, err, "reserved")

	_, err = ours.Marshal("topic", message.NewMessage("uuid-3", nil))
	require.ErrorContains(t, err, "cannot generate partition key: no aggregate_id")
}

func encoded(t *testing.T, e sarama.Encoder) []byte {
	t.Helper()
	b, err := e.Encode()
	require.NoError(t, err)
	return b
}

func sortedHeaders(hs []sarama.RecordHeader) []sarama.RecordHeader {
	return slices.SortedFunc(slices.Values(hs), func(a, b sarama.RecordHeader) int { return cmp.Compare(string(a.Key), string(b.Key)) })
}

func pointers(hs []sarama.RecordHeader) []*sarama.RecordHeader {
	out := make([]*sarama.RecordHeader, len(hs))
	for i := range hs {
		out[i] = &hs[i]
	}
	return out
}
