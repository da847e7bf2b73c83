package middleware_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestRetry_DeterministicSQLErrorIsPermanent: an error PostgreSQL raises for
// the data or the statement itself (SQLSTATE class 22, 23, 42 or 54) fails the
// same way on every re-run: it goes to the DLQ with its own error code
// instead of stalling its partition for ever. A connection or server error,
// and a missing table or privilege (the environment, the same for every
// message), still retry without end, and a deadlock gets its re-runs, then
// backs off.
func TestRetry_DeterministicSQLErrorIsPermanent(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	_, err := db.Exec(`CREATE TABLE mwtest_unique (id int PRIMARY KEY); INSERT INTO mwtest_unique VALUES (1);
		CREATE TABLE mwtest_indexed (v text); CREATE INDEX ON mwtest_indexed (v)`)
	require.NoError(t, err)
	_, err = db.Exec(`DO $$ BEGIN CREATE ROLE mwtest_nobody; EXCEPTION WHEN duplicate_object THEN NULL; END $$`)
	require.NoError(t, err)
	unreachable, err := sqlx.Open("postgres", "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5")
	require.NoError(t, err)
	t.Cleanup(func() { unreachable.Close() })
	exec := func(q *sqlx.DB, query string) error {
		_, err := q.Exec(query)
		return fmt.Errorf("apply contributions: %w", err)
	}

	for _, tc := range []struct {
		name, sqlstate string
		run            func() error
	}{
		{"data exception", "22012", func() error { return exec(db, `SELECT 1 / 0`) }},
		{"integrity violation", "23505", func() error { return exec(db, `INSERT INTO mwtest_unique VALUES (1)`) }},
		{"syntax or access", "42804", func() error { return exec(db, `SELECT * FROM mwtest_unique WHERE id`) }},
		{"program limit", "54000", func() error { // an index row too large
			return exec(db, `INSERT INTO mwtest_indexed SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 300)`)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stop := make(chan struct{})
			b := setupRetry(t, middleware.RetryConfig{InitialInterval: time.Millisecond, Close: stop}, func(call int) error {
				if call == 2 {
					close(stop) // a re-run: end the retry, the test has failed
				}
				return tc.run()
			})

			_, err := b.deadLettering(newMessage(t))

			require.NoError(t, err, "dead-lettered and acked")
			require.EqualValues(t, 1, b.calls.Load(), "a deterministic SQL error is not re-run")
			dead := b.dlq.published()
			require.Len(t, dead, 1)
			require.Equal(t, middleware.CodeSQLRejected, dead[0].Metadata.Get(middleware.HeaderDLQErrorCode))
			require.Contains(t, dead[0].Metadata.Get(middleware.HeaderDLQReason), "SQLSTATE "+tc.sqlstate)
		})
	}

	for _, tc := range []struct {
		name string
		run  func() error
	}{
		{"connection refused", func() error { return exec(unreachable, `SELECT 1`) }},
		{"missing table (a migration not applied yet)", func() error { return exec(db, `SELECT * FROM mwtest_no_such_table`) }},
		{"missing privilege", func() error {
			tx, err := db.Beginx()
			require.NoError(t, err)
			defer tx.Rollback() //nolint:errcheck // the role lasts only as long as tx
			_, err = tx.Exec(`SET LOCAL ROLE mwtest_nobody`)
			require.NoError(t, err)
			_, err = tx.Exec(`SELECT * FROM mwtest_unique`) // 42501
			return fmt.Errorf("apply contributions: %w", err)
		}},
		{"statement timeout", func() error {
			return exec(db, `SET statement_timeout = 1; SELECT pg_sleep(1)`) // 57014, class 57: the server, not the data
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const failures = 3
			b := setupRetry(t, middleware.RetryConfig{InitialInterval: time.Millisecond, MaxInterval: time.Millisecond},
				func(call int) error {
					if call <= failures {
						return tc.run()
					}
					return nil
				})

			_, err := b.deadLettering(newMessage(t))

			require.NoError(t, err)
			require.EqualValues(t, failures+1, b.calls.Load(), "retried until it cleared")
			require.Empty(t, b.dlq.published())
			for _, r := range b.retried() {
				require.Equal(t, middleware.RetryInfrastructure, r.kind)
			}
		})
	}

	t.Run("deadlock outlives its re-reads", func(t *testing.T) {
		const failures = middleware.RetryConflictRetriesDefault + 2
		b := setupRetry(t, middleware.RetryConfig{InitialInterval: time.Millisecond, MaxInterval: time.Millisecond},
			func(call int) error {
				if call <= failures {
					return fmt.Errorf("apply contributions: %w: %w", errConflict, &pq.Error{Code: "40P01"})
				}
				return nil
			})

		_, err := b.deadLettering(newMessage(t))

		require.NoError(t, err, "a deadlock is contention, never the record's fault")
		require.EqualValues(t, failures+1, b.calls.Load())
		require.Empty(t, b.dlq.published())
		var kinds []string
		for _, r := range b.retried() {
			kinds = append(kinds, r.kind)
		}
		require.Equal(t, []string{middleware.RetryConflict, middleware.RetryConflict, middleware.RetryConflict,
			middleware.RetryInfrastructure, middleware.RetryInfrastructure}, kinds, "re-reads first, then backoff")
	})
}
