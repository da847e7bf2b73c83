package boost_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
)

// TestCopier_RefusedRowsAreLeftOutAndTheRestCopied: rows that PostgreSQL
// refuses (a time out of its range, a malformed number) among others,
// copied in chunks of 40: each refused row is reported once with its
// SQLSTATE and left out, every other row is committed; without a Refused
// callback a refused row fails the copy.
func TestCopier_RefusedRowsAreLeftOutAndTheRestCopied(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Exec(`CREATE UNLOGGED TABLE catalog.copy_test (n integer NOT NULL, at timestamptz NOT NULL)`)
	require.NoError(t, err)
	bad := map[int]string{7: "22008", 41: "22P02", 99: "22008"} // row: the SQLSTATE PostgreSQL refuses it with
	row := func(i int) []any {
		switch bad[i] {
		case "22008":
			return []any{i, "300000-01-01T00:00:00Z"}
		case "22P02":
			return []any{fmt.Sprint(i, "x"), "2024-01-01T00:00:00Z"}
		}
		return []any{i, "2024-01-01T00:00:00Z"}
	}
	var mu sync.Mutex
	refused := map[string]string{}
	var committed []int64
	c, err := boost.NewCopier(ctx, boost.CopyConfig{DB: b.db, Schema: "catalog", Table: "copy_test",
		Columns: []string{"n", "at"}, ChunkRows: 40,
		Refused: func(row []any, err *pq.Error) {
			mu.Lock()
			defer mu.Unlock()
			refused[fmt.Sprint(row[0])] = string(err.Code)
		},
		Committed: func(_ context.Context, rows int64) error {
			committed = append(committed, rows)
			return nil
		}})
	require.NoError(t, err)
	for i := range 100 {
		require.NoError(t, c.Add(row(i)...))
	}
	require.NoError(t, c.Close())

	require.Equal(t, map[string]string{"7": "22008", "41x": "22P02", "99": "22008"}, refused)
	require.EqualValues(t, 97, c.Rows())
	require.Equal(t, 97, b.count(t, `SELECT count(*) FROM catalog.copy_test`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM catalog.copy_test WHERE n IN (7, 41, 99)`))
	require.EqualValues(t, 97, committed[len(committed)-1], "each commit reports the rows committed so far")

	strict, err := boost.NewCopier(ctx, boost.CopyConfig{DB: b.db, Schema: "catalog", Table: "copy_test",
		Columns: []string{"n", "at"}})
	require.NoError(t, err)
	require.NoError(t, strict.Add(row(7)...))
	err = strict.Close()
	var pqErr *pq.Error
	require.ErrorAs(t, err, &pqErr)
	require.EqualValues(t, "22008", pqErr.Code)
	require.Zero(t, strict.Rows())
}

// TestCopier_AChunkCommitsWhenItsTimeRunsOut: a transaction copies for
// ChunkTime at most, however many rows its chunk has left: the rest goes in
// the next one, and every row is copied once.
func TestCopier_AChunkCommitsWhenItsTimeRunsOut(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Exec(`CREATE UNLOGGED TABLE catalog.copy_timed (n integer NOT NULL)`)
	require.NoError(t, err)
	var commits int
	c, err := boost.NewCopier(ctx, boost.CopyConfig{DB: b.db, Schema: "catalog", Table: "copy_timed",
		Columns: []string{"n"}, ChunkRows: 50, ChunkTime: time.Nanosecond,
		Committed: func(context.Context, int64) error { commits++; return nil }})
	require.NoError(t, err)
	for i := range 100 {
		require.NoError(t, c.Add(i))
	}
	require.NoError(t, c.Close())
	require.Equal(t, 100, commits, "a transaction a row: each one's time ran out after its first")
	require.Equal(t, 100, b.count(t, `SELECT count(DISTINCT n) FROM catalog.copy_timed`))
	require.EqualValues(t, 100, c.Rows())
}
