package kafkakit

import (
	"errors"
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
)

// TestDelivered_AnAcknowledgedRecordBehindARefusedOneOfItsKeyGoesAgain: a
// resend that left out an acknowledged record sent after a refused one of
// the same key would put the older record last on the topic, which
// compaction keeps as the key's state.
func TestDelivered_AnAcknowledgedRecordBehindARefusedOneOfItsKeyGoesAgain(t *testing.T) {
	t.Parallel()
	record := func(uuid, key string) *sarama.ProducerMessage {
		return &sarama.ProducerMessage{Key: sarama.StringEncoder(key), Metadata: uuid}
	}
	records := []*sarama.ProducerMessage{
		record("a1", "a"), record("b1", "b"), record("a2", "a"), record("c1", "c"), record("b2", "b"),
		record("a3", "a"), {Metadata: "n1"}, {Metadata: "n2"},
	}
	failed := map[string]error{"a2": errors.New("refused"), "n1": errors.New("refused")}

	require.Equal(t, map[string]bool{"a1": true, "b1": true, "c1": true, "b2": true, "n2": true}, delivered(records, failed),
		"a3 was acknowledged behind the refused a2: it goes again, after a2")
}
