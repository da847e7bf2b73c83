package router_test

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestRelay_BatchesOfTheJSONLayoutAreRelayed: rows that a release before the
// framed layout wrote, whose batch is a JSON array of events, are relayed
// beside framed rows, alone (a large row) and merged with small framed
// neighbours: every event once, in commit order, with its key, value and
// headers.
func TestRelay_BatchesOfTheJSONLayoutAreRelayed(t *testing.T) {
	b := setupPromotion(t, 1)
	txs := [][]*message.Message{
		purchaseEvents(t, 1, "relay-json"), purchaseEvents(t, 3, "relay-json"), purchaseEvents(t, 2, "relay-json"),
		purchaseEvents(t, outbox.MergeRowsBelow+5, "relay-json"), purchaseEvents(t, 1, "relay-json"),
	}
	gate, err := outbox.BeginTx(t.Context(), b.db, nil) // every row visible at once, so that small rows merge
	require.NoError(t, err)
	gate.MustExec(`SELECT pg_current_xact_id()`)
	for i, tx := range txs {
		if i%2 == 1 {
			writeJSONLayout(t, b, tx)
		} else {
			writeOutbox(t, b, tx)
		}
	}
	b.start(t, time.Hour)
	require.NoError(t, gate.Commit())

	want, got := relayed(t, b.topic, txs)
	require.Equal(t, want, got, "every event once, in commit order")
	records := kafkatest.ReadTopic(t, b.topic, time.Minute, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= len(want) })
	i := 0
	for _, tx := range txs {
		for _, m := range tx {
			r := records[i]
			require.Equal(t, []byte(m.Payload), r.Value, "event %d", i)
			require.Equal(t, m.Metadata.Get(event.HeaderAggregateID), string(r.Key), "event %d", i)
			require.Equal(t, m.Metadata.Get(event.HeaderCorrelationID), kafkatest.Header(r, event.HeaderCorrelationID), "event %d", i)
			require.Equal(t, m.UUID, kafkatest.Header(r, kafka.UUIDHeaderKey), "event %d", i)
			i++
		}
	}
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(b.metrics.OutboxRelayed) == float64(len(want))
	}, 30*time.Second, 20*time.Millisecond)
}

// writeJSONLayout writes msgs as one outbox row in the layout of a release
// before the framed one: the forwarder's envelope around a JSON array of the
// events, its metadata and the row's holding their count.
func writeJSONLayout(t *testing.T, b promotionBundle, msgs []*message.Message) {
	t.Helper()
	type packed struct {
		UUID     string           `json:"uuid"`
		Payload  []byte           `json:"payload"`
		Metadata message.Metadata `json:"metadata"`
	}
	events := make([]packed, len(msgs))
	for i, m := range msgs {
		events[i] = packed{m.UUID, m.Payload, m.Metadata}
	}
	batch, err := json.Marshal(events)
	require.NoError(t, err)
	envelope, err := json.Marshal(map[string]any{"destination_topic": b.topic, "uuid": "json-layout-" + kafkatest.RandomSuffix(),
		"payload": batch, "metadata": map[string]string{outbox.EventsMetadataKey: strconv.Itoa(len(msgs))}})
	require.NoError(t, err)

	tx, err := outbox.BeginTx(t.Context(), b.db, nil)
	require.NoError(t, err)
	tx.MustExec(`INSERT INTO `+outbox.MessagesTable+` (uuid, payload, metadata, transaction_id)
		VALUES (gen_random_uuid()::text, $1, json_build_object($2::text, $3::text), pg_current_xact_id())`,
		string(envelope), outbox.EventsMetadataKey, strconv.Itoa(len(msgs)))
	require.NoError(t, tx.Commit())
}
