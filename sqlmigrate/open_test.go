package sqlmigrate_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/sqlmigrate"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestOpen_StatementsThroughATransactionPoolerRunAsSent: many clients share
// two server connections of a PgBouncer in transaction pooling and send
// statements with parameters outside any transaction; each runs whole, as
// sent. (Sent in two exchanges, as lib/pq does by default, they failed with
// "bind message supplies 1 parameters, but prepared statement "" requires 2",
// or ran another client's statement text with their parameters.)
func TestOpen_StatementsThroughATransactionPoolerRunAsSent(t *testing.T) {
	t.Parallel()
	bouncer := pgtest.StartPgBouncer(t, pgtest.PgBouncerOptions{Upstream: pgtest.DatabaseURL(t), PoolSize: 2})
	db, err := sqlmigrate.Open(bouncer.URL())
	require.NoError(t, err)
	defer db.Close()
	db.SetMaxOpenConns(20)

	var failed, wrong atomic.Int64
	var firstErr sync.Once
	var wg sync.WaitGroup
	for c := range 20 {
		wg.Go(func() {
			for i := range 100 {
				sent := fmt.Sprintf("%d-%d", c, i)
				var got, want string
				var err error
				switch i % 3 {
				case 0:
					want, err = sent+"a", db.QueryRow(`SELECT $1::text || 'a'`, sent).Scan(&got)
				case 1:
					want, err = sent+"b", db.QueryRow(`SELECT $1::text || 'b'`, sent).Scan(&got)
				default:
					want, err = sent+"c", db.QueryRow(`SELECT $1::text || $2::text`, sent, "c").Scan(&got)
				}
				switch {
				case err != nil:
					failed.Add(1)
					firstErr.Do(func() { t.Log("first error:", err) })
				case got != want:
					wrong.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("failed %d, answered for another %d", failed.Load(), wrong.Load())
	require.Zero(t, failed.Load(), "statements that failed")
	require.Zero(t, wrong.Load(), "statements that answered for another")
}
