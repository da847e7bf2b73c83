package router_test

import (
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/logtest"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestRelay_UnreadableRowIsLoggedWithItsOffsetAndCounted: an outbox row
// whose batch of events cannot be unwrapped stops the relay there (the rows
// behind it keep their order), and says so: an ERROR with the row's offset
// (its id in promotion.outbox_messages) and promotion_outbox_unreadable_rows_total,
// whether the row goes alone or merged with its neighbours.
func TestRelay_UnreadableRowIsLoggedWithItsOffsetAndCounted(t *testing.T) {
	for name, envelope := range map[string]string{
		// A row the merge does not recognise goes alone, as written.
		"alone": `json_build_object('destination_topic', payload->>'destination_topic', 'uuid', payload->>'uuid',
			'payload', 'bm90IGpzb24=', 'metadata', payload->'metadata')`,
		// A row in the forwarder's layout is merged with its small neighbours.
		"merged": `('{"destination_topic":"' || (payload->>'destination_topic') || '","uuid":"' || (payload->>'uuid')
			|| '","payload":"bm90IGpzb24=","metadata":' || (payload->'metadata')::text || '}')::json`,
	} {
		t.Run(name, func(t *testing.T) {
			b := setupPromotion(t, 1)
			txs := [][]*message.Message{purchaseEvents(t, 1, "relay-unreadable"), purchaseEvents(t, 1, "relay-unreadable"),
				purchaseEvents(t, 1, "relay-unreadable")}
			gate := b.db.MustBegin() // every row visible at once
			gate.MustExec(`SELECT pg_current_xact_id()`)
			writeOutbox(t, b, txs...)
			var offsets []int64
			require.NoError(t, b.db.Select(&offsets, `SELECT "offset" FROM promotion.outbox_messages ORDER BY "offset"`))
			require.Len(t, offsets, 3)
			bad := offsets[1] // its batch payload is "not json"
			b.db.MustExec(`UPDATE promotion.outbox_messages SET payload = `+envelope+` WHERE "offset" = $1`, bad)

			logs := &logtest.Logs{}
			b.startRouter(t, router.PromotionConfig{}, expire.Config{Interval: time.Hour}, logs.Logger())
			require.NoError(t, gate.Commit())

			require.Eventually(t, func() bool { return testutil.ToFloat64(b.metrics.OutboxUnreadable) >= 2 },
				time.Minute, 10*time.Millisecond, "the relay counts each attempt at the row")
			logged := logs.Find(slog.LevelError, "outbox row unreadable; the relay stops at it until it is repaired")
			require.NotEmpty(t, logged)
			require.Equal(t, strconv.FormatInt(bad, 10), logged[0]["offset"], "the log names the row")
			require.Contains(t, logged[0]["error"], "unreadable outbox row")
			for _, r := range topicMessageIDs(t, b.topic) {
				require.NotEqual(t, txs[2][0].UUID, r, "nothing behind the row is relayed")
			}
		})
	}
}

// topicMessageIDs is the MessageIds of the records on topic now.
func topicMessageIDs(t *testing.T, topic string) []string {
	t.Helper()
	size := catalogtest.TopicSize(t, topic)
	records := kafkatest.ReadTopic(t, topic, time.Minute, func(ms []*sarama.ConsumerMessage) bool { return int64(len(ms)) >= size })
	out := make([]string, len(records))
	for i, r := range records {
		out[i] = kafkatest.Header(r, kafka.UUIDHeaderKey)
	}
	return out
}
