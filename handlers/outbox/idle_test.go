package outbox_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestRelaySchema_FrozenHolderLosesItsSessionAndThePosition: a relay that
// holds the position and then does nothing on its transaction (a process
// stopped with its connection up) loses its session once the idle limit
// passes, and the position is free for another process.
func TestRelaySchema_FrozenHolderLosesItsSessionAndThePosition(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	db.MustExec(`INSERT INTO `+outbox.OffsetsTable+` (consumer_group, offset_acked, last_processed_transaction_id)
		VALUES ($1, 0, '0') ON CONFLICT DO NOTHING`, outbox.RelayConsumerGroup)
	schema := outbox.RelaySchema(10, nil, 0, 300*time.Millisecond)
	tx, err := db.BeginTx(t.Context(), &sql.TxOptions{Isolation: schema.SubscribeIsolationLevel()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	var pid int
	require.NoError(t, tx.QueryRow(`SELECT pg_backend_pid()`).Scan(&pid))
	q := schema.SelectQuery(outbox.ForwarderTopic, outbox.RelayConsumerGroup, outbox.Offsets())
	rows, err := tx.Query(q.Query, q.Args...)
	require.NoError(t, err)
	require.NoError(t, rows.Close())

	require.Eventually(t, func() bool {
		var n int
		return db.Get(&n, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid) == nil && n == 0
	}, 30*time.Second, 20*time.Millisecond, "the frozen holder's idle position transaction keeps its session")
	other := db.MustBegin()
	defer func() { require.NoError(t, other.Rollback()) }()
	var group string
	require.NoError(t, other.Get(&group, `SELECT consumer_group FROM `+outbox.OffsetsTable+` WHERE consumer_group = $1 FOR UPDATE NOWAIT`,
		outbox.RelayConsumerGroup), "another process takes the position")
}
