package middleware_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// fixedRun is a claim whose next offset is fixed.
type fixedRun int64

func (r fixedRun) Next([]int64) (int64, bool) { return int64(r), true }

// TestOffsets_AnotherWorkersCommitIsNoLoss: a transaction's statement reads
// a partition's offsets with the snapshot it began with, and here waits (for
// a row another session holds) while another worker of the process commits
// a higher offset to the partition and notes it. That commit is not in the
// statement's snapshot and is no loss: no claim is stopped (a false loss
// ends the session again and again, and the consumer stalls).
func TestOffsets_AnotherWorkersCommitIsNoLoss(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	ctx := context.Background()
	o := middleware.NewOffsets(db, nil)
	stopped := make(chan struct{}, 2)
	o.Claim("t", 0, fixedRun(10), func() { stopped <- struct{}{} })
	at := []middleware.Position{{Topic: "t", Partition: 0, Offset: 9}}
	db.MustExec(`INSERT INTO catalog.consumer_offsets (topic, partition, slot, next_offset) VALUES ('t', 0, 0, 1)`)

	holder, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer holder.Rollback()
	holder.MustExec(`SELECT 1 FROM catalog.consumer_offsets WHERE slot = 0 FOR UPDATE`)

	waiting, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer waiting.Rollback()
	errc := make(chan error, 1)
	go func() {
		_, err := o.StoreTx(ctx, waiting, 0, at) // waits for the holder's row
		errc <- err
	}()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`))
		return n == 1
	}, 10*time.Second, 5*time.Millisecond, "the transaction waits for the held row")

	other, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	noted, err := o.StoreTx(ctx, other, 1, at)
	require.NoError(t, err)
	require.NoError(t, other.Commit())
	noted()

	require.NoError(t, holder.Commit())
	require.NoError(t, <-errc, "another worker's commit is no loss")
	require.Empty(t, stopped, "no claim was stopped")
}
