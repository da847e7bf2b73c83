package outbox_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

func TestUnpack_MessageWithoutEventsKeyIsOneEvent(t *testing.T) {
	msg := message.NewMessage("m-1", []byte(`{"PurchaseId":"x"}`))
	msg.Metadata.Set("aggregate_id", "x")
	got, err := outbox.Unpack(msg)
	require.NoError(t, err)
	require.Equal(t, []*message.Message{msg}, got)
}

func TestPublishTx_OneRowPerTransactionThatUnpacksToItsEventsInOrder(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	msgs := make([]*message.Message, outbox.MaxEventsPerRow+3)
	for i := range msgs {
		msgs[i] = message.NewMessage(kafkatest.RandomSuffix(), []byte(`{"n":1}`))
		msgs[i].Metadata.Set("aggregate_id", kafkatest.RandomSuffix())
	}
	tx, err := outbox.BeginTx(t.Context(), db, nil)
	require.NoError(t, err)
	require.NoError(t, outbox.PublishTx(tx, "dest", msgs...))
	require.NoError(t, tx.Commit())

	var rows []struct {
		Payload  []byte `db:"payload"`
		Metadata []byte `db:"metadata"`
	}
	require.NoError(t, db.Select(&rows, `SELECT payload::text::bytea AS payload, metadata::text::bytea AS metadata
		FROM promotion.outbox_messages ORDER BY "offset"`))
	require.Len(t, rows, 2, "MaxEventsPerRow, then the rest")
	require.JSONEq(t, `{"outbox_events":"500"}`, string(rows[0].Metadata))
	require.JSONEq(t, `{"outbox_events":"3"}`, string(rows[1].Metadata))

	got := purchasetest.OutboxMessages(t, db)
	require.Len(t, got, len(msgs))
	for i, m := range msgs {
		require.Equal(t, m.UUID, got[i].UUID)
		require.Equal(t, m.Payload, got[i].Payload)
		require.Equal(t, m.Metadata, got[i].Metadata)
	}
	stats, err := outbox.ReadStats(t.Context(), db)
	require.NoError(t, err)
	require.EqualValues(t, len(msgs), stats.Backlog, "the backlog counts events")
}
