package router

import (
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit"
)

// TestConsumerBuffers_SizeTheSubscribersSaramaConfig: what a subscriber
// holds while it catches up comes from the settings, or their defaults,
// never Sarama's own (1 MiB a partition, 50 MiB a response, 256 records).
func TestConsumerBuffers_SizeTheSubscribersSaramaConfig(t *testing.T) {
	sc := sarama.NewConfig()
	ConsumerBuffers{}.apply(sc)
	require.EqualValues(t, FetchPartitionBytesDefault, sc.Consumer.Fetch.Default)
	require.EqualValues(t, FetchResponseBytesDefault, sc.Consumer.Fetch.MaxBytes)
	require.Equal(t, ReadAheadDefault, sc.ChannelBufferSize)
	require.NoError(t, sc.Validate())

	ConsumerBuffers{FetchPartitionBytes: 4096, FetchResponseBytes: 65536, ReadAhead: 8}.apply(sc)
	require.EqualValues(t, 4096, sc.Consumer.Fetch.Default)
	require.EqualValues(t, 65536, sc.Consumer.Fetch.MaxBytes)
	require.Equal(t, 8, sc.ChannelBufferSize)

	require.Error(t, ConsumerBuffers{FetchPartitionBytes: 1 << 20, FetchResponseBytes: 1 << 10}.Validate(),
		"a response smaller than one partition's fetch")
	require.Error(t, ConsumerBuffers{ReadAhead: -1}.Validate())
	require.Error(t, ConsumerBuffers{ReadAheadBytes: -1}.Validate())
	_, _, err := NewConsumerGroupSubscriber(kafkakit.Cluster{Brokers: []string{"127.0.0.1:1"}}, "g", ConsumerBuffers{ReadAhead: -1}, nil, nil, nil, nil)
	require.Error(t, err)
}
