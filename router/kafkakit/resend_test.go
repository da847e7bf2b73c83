package kafkakit_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestResender_RemembersOnlyTheLastCallsAcknowledgedMessages: Kafka refuses
// a record too large for the topic and takes the others; the Resender keeps
// only what the call it just made got acknowledged, forgets what a later
// call no longer names, and keeps nothing once a call succeeds whole.
func TestResender_RemembersOnlyTheLastCallsAcknowledgedMessages(t *testing.T) {
	t.Parallel()
	topic := kafkatest.TopicConfigured(t, 3, map[string]string{"max.message.bytes": "16384"})
	pub, err := kafkakit.NewBatchPublisher(kafkakit.BatchPublisherConfig{Cluster: kafkatest.Cluster(t), ClientID: "resend-test",
		Marshaler: kafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) { return m.UUID, nil })})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	r := kafkakit.NewResender(pub)
	msgs := make([]*message.Message, 12)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(`{"small":true}`))
	}
	big := message.NewMessage(watermill.NewUUID(), []byte(strings.Repeat("x", 64<<10)))
	msgs[5] = big

	err = r.Publish(topic, msgs...)
	var be *kafkakit.BatchError
	require.True(t, errors.As(err, &be), "Kafka refused part of the call: %v", err)
	require.Contains(t, be.Failed, big.UUID)
	require.Len(t, be.Delivered, len(msgs)-len(be.Failed))
	require.Equal(t, len(be.Delivered), r.Remembered(), "the acknowledged messages of the call, no more")

	kept := msgs[:6] // the caller moved on: a call of fewer messages
	err = r.Publish(topic, kept...)
	require.Error(t, err)
	require.LessOrEqual(t, r.Remembered(), len(kept)-1, "only messages the last call named are kept")

	require.NoError(t, r.Publish(topic, msgs[6:]...))
	require.Zero(t, r.Remembered(), "nothing is kept once a call succeeds whole")
}
