package outbox_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestOutbox_OnlyAWriterThatTookTheLockFirstWritesIt: the relay's horizon
// waits only for holders of the outbox writer lock that took it before their
// transaction had an id, so the database refuses an outbox row from any
// other transaction, and the lock from a transaction that has an id already.
func TestOutbox_OnlyAWriterThatTookTheLockFirstWritesIt(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	msg := message.NewMessage("u-1", []byte(`{}`))
	insert := `INSERT INTO ` + outbox.MessagesTable + ` (uuid, payload, metadata, transaction_id)
		VALUES ('u-1', '{}', '{}', pg_current_xact_id())`
	refused := func(err error) {
		t.Helper()
		var pqErr *pq.Error
		require.True(t, errors.As(err, &pqErr), "refused by the database: %v", err)
		require.EqualValues(t, "55000", pqErr.Code, pqErr.Message)
	}

	plain := db.MustBegin()
	_, err := plain.Exec(insert)
	refused(err)
	require.NoError(t, plain.Rollback())

	late := db.MustBegin()
	late.MustExec(`SELECT pg_current_xact_id()`)
	_, err = late.Exec(`SELECT promotion.outbox_writer_lock()`)
	refused(err)
	require.NoError(t, late.Rollback())

	tx, err := outbox.BeginTx(t.Context(), db, nil)
	require.NoError(t, err)
	require.NoError(t, outbox.PublishTx(tx, "dest", msg))
	require.NoError(t, tx.Commit())
	var rows int
	require.NoError(t, db.Get(&rows, `SELECT count(*) FROM `+outbox.MessagesTable))
	require.Equal(t, 1, rows)
}
