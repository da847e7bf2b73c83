package kafkakit_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestRecordLimit_ATopicNotThereYetTakesTheBrokersDefault: a DLQ or replay
// topic that does not exist when a process starts (another process, or an
// operator, creates it later) is no reason not to start: its records are
// sized to the broker's message.max.bytes, which it will inherit, and the
// publisher is made; the topic stays uncreated.
func TestRecordLimit_ATopicNotThereYetTakesTheBrokersDefault(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Cluster(t)
	topic := "pf-test-missing-" + kafkatest.RandomSuffix()
	limit, err := cluster.RecordLimit(context.Background(), topic, kafka.DefaultMarshaler{})
	require.ErrorIs(t, err, kafkakit.ErrNoSuchTopic)
	require.Greater(t, limit.MaxMessageBytes, 1000, "the broker's message.max.bytes")

	pub, limit2, err := cluster.NewLimitedPublisher(context.Background(), topic, "promoflow-test", kafka.DefaultMarshaler{},
		watermill.NopLogger{})
	require.NoError(t, err)
	require.NoError(t, pub.Close())
	require.Equal(t, limit.MaxMessageBytes, limit2.MaxMessageBytes)
	state, err := cluster.DescribeTopic(context.Background(), topic)
	require.NoError(t, err)
	require.True(t, state.Missing, "the topic is not created")
}
