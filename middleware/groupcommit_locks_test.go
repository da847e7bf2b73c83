package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// wideItem is an event with its purchase and card targets, applied as
// boost.ApplyBatch applies one: an exclusive advisory lock per purchase and a
// shared one per target, all in one statement.
type wideItem struct {
	purchase string
	targets  []string
	gate     chan struct{} // when set, the item's transaction waits for it to close
}

func (w wideItem) locks() int { return 1 + len(w.targets) }

// TestGroupCommit_WideBatchStaysUnderTheLockTable: 64 events of 100 distinct
// targets each wait together for two workers on a server of 20 connections,
// whose shared lock table holds about 2,700 locks; every transaction stays
// within the group commit's lock bound (no 53200), batches still hold several
// events, and an event wider than the bound goes alone.
func TestGroupCommit_WideBatchStaysUnderTheLockTable(t *testing.T) {
	t.Parallel()
	db, err := sqlx.Open("postgres", pgtest.StartServer(t, pgtest.ServerOptions{Settings: map[string]string{"max_connections": "20"}}).URL("sslmode=disable"))
	require.NoError(t, err)
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { db.Close() })
	_, err = db.Exec(`CREATE SCHEMA catalog;
		CREATE TABLE catalog.processed_messages (key text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now());
		CREATE TABLE catalog.processed_records (message_id_digest bytea, payload_digest bytea,
			processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (message_id_digest, payload_digest))`)
	require.NoError(t, err)

	var (
		mu       sync.Mutex
		sqlErrs  []string
		held     []int // advisory locks each transaction held, in commit order
		sizes    []int // items of each transaction
		entered  atomic.Int32
		bound    = middleware.GroupCommitMaxLocksDefault
		gate     = make(chan struct{})
		released bool
	)
	defer func() {
		if !released {
			close(gate)
		}
	}()
	apply := func(ctx context.Context, tx *sqlx.Tx, items []wideItem) ([]int, error) {
		if items[0].gate != nil {
			entered.Add(1)
			<-items[0].gate
		}
		var keys []string
		for _, it := range items {
			keys = append(keys, "x:"+it.purchase)
			for _, target := range it.targets {
				keys = append(keys, "s:"+target)
			}
		}
		var n int
		_, err := tx.ExecContext(ctx, `SELECT CASE WHEN left(k, 2) = 's:' THEN pg_advisory_xact_lock_shared(hashtextextended(k, 0))
				ELSE pg_advisory_xact_lock(hashtextextended(k, 0)) END
			FROM unnest($1::text[]) AS k ORDER BY hashtextextended(k, 0)`, pq.Array(keys))
		if err == nil {
			err = tx.GetContext(ctx, &n, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`)
		}
		mu.Lock()
		defer mu.Unlock()
		var pqErr *pq.Error
		if errors.As(err, &pqErr) {
			sqlErrs = append(sqlErrs, fmt.Sprintf("SQLSTATE %s (%s) in a transaction of %d events: %s",
				pqErr.Code, pqErr.Code.Name(), len(items), pqErr.Message))
		}
		if err != nil {
			return nil, err
		}
		held, sizes = append(held, n), append(sizes, len(items))
		return make([]int, len(items)), nil
	}
	gc, err := middleware.NewGroupCommit(middleware.GroupCommitConfig{DB: db, Workers: 2}, apply, wideItem.locks)
	require.NoError(t, err)

	do := func(it wideItem, serial string) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, _, err := gc.Do(message.NewMessage(watermill.NewUUID(), nil), serial, it)
			done <- err
		}()
		return done
	}
	// Two gate items of one serial hold one transaction each, one per worker,
	// while the wide events queue up behind them.
	var waits []<-chan error
	for range 2 {
		waits = append(waits, do(wideItem{purchase: watermill.NewUUID(), gate: gate}, "gate"))
	}
	require.Eventually(t, func() bool { return entered.Load() == 2 }, 30*time.Second, time.Millisecond)
	const events, targets = 128, 100 // two workers' worth of 64-event batches
	for range events {
		it := wideItem{purchase: watermill.NewUUID()}
		for range targets {
			it.targets = append(it.targets, watermill.NewUUID())
		}
		waits = append(waits, do(it, it.purchase))
	}
	widest := wideItem{purchase: watermill.NewUUID()}
	for range bound + 44 {
		widest.targets = append(widest.targets, watermill.NewUUID())
	}
	waits = append(waits, do(widest, widest.purchase))
	require.Eventually(t, func() bool { return gc.Waiting() == events+1 }, 30*time.Second, time.Millisecond)
	close(gate)
	released = true
	for _, done := range waits {
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(2 * time.Minute):
			t.Fatal("an event was not committed")
		}
	}

	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, sqlErrs, "no transaction may overrun the server's lock table")
	require.Len(t, held, len(sizes))
	for i, n := range held {
		if sizes[i] > 1 {
			require.LessOrEqual(t, n, bound, "transaction %d of %d events held %d advisory locks", i, sizes[i], n)
		}
	}
	require.Contains(t, held, widest.locks(), "the event wider than the bound went alone")
	require.Greater(t, slices.Max(sizes), 1, "events still share transactions")
	t.Logf("%d transactions; events each: %v; advisory locks each: %v", len(sizes), sizes, held)
}
