package bounded_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/bounded"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestRead_EndsAtATransactionMarkerAndSkipsAbortedRecords: a partition whose
// last offsets are a transaction's marker, after an aborted transaction's
// records, is read to its end: the read returns with the committed records
// only, instead of waiting for offsets no consumer receives.
func TestRead_EndsAtATransactionMarkerAndSkipsAbortedRecords(t *testing.T) {
	t.Parallel()
	topic := kafkatest.Topic(t, 1)
	cfg := kafkatest.Cluster(t).DurableProducerConfig("bounded-tail-test")
	cfg.Producer.Transaction.ID = "bounded-tail-test." + topic
	producer, err := sarama.NewSyncProducer(kafkatest.Brokers(t), cfg)
	require.NoError(t, err)
	defer producer.Close()
	send := func(value string, commit bool) {
		require.NoError(t, producer.BeginTxn())
		_, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder(value)})
		require.NoError(t, err)
		if commit {
			require.NoError(t, producer.CommitTxn())
		} else {
			require.NoError(t, producer.AbortTxn())
		}
	}
	send("committed", true)
	send("aborted", false)

	client, err := bounded.Dial(kafkatest.Cluster(t), "bounded-tail-test")
	require.NoError(t, err)
	defer client.Close()
	parts, err := client.Partitions(topic)
	require.NoError(t, err)
	require.Len(t, parts, 1)
	require.EqualValues(t, 4, parts[0].Newest, "a record and a marker a transaction")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got []string
	err = client.Read(ctx, []bounded.Range{parts[0].Whole()}, func(_ context.Context, m *sarama.ConsumerMessage) error {
		got = append(got, string(m.Value))
		return nil
	}, nil)
	require.NoError(t, err, "the read ends at the partition's end")
	require.Equal(t, []string{"committed"}, got)
}
