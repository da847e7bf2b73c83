package pgtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// BackendPid is the PostgreSQL backend that runs tx.
func BackendPid(t testing.TB, tx *sqlx.Tx) int {
	t.Helper()
	var pid int
	require.NoError(t, tx.Get(&pid, `SELECT pg_backend_pid()`))
	return pid
}

// WaitBlockedBy waits until a backend of db's database waits for a lock that
// the backend blocker holds (pg_stat_activity, pg_blocking_pids), and returns
// its pid: a test forces an interleaving by lock waits, not by sleeps.
func WaitBlockedBy(t testing.TB, db *sqlx.DB, blocker int) int {
	t.Helper()
	var pid int
	require.Eventually(t, func() bool {
		err := db.Get(&pid, `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND $1 = ANY(pg_blocking_pids(pid))
			ORDER BY pid LIMIT 1`, blocker)
		return err == nil
	}, 30*time.Second, 5*time.Millisecond, "no backend waits for a lock of backend %d", blocker)
	return pid
}

// SlowUpdates makes each UPDATE statement on table (schema-qualified) take
// at least d longer, by a statement trigger that sleeps: a test lets a
// statement outlast a deadline by construction, not by a guess at its speed.
func SlowUpdates(t testing.TB, db *sqlx.DB, table string, d time.Duration) {
	t.Helper()
	_, err := db.Exec(fmt.Sprintf(`CREATE FUNCTION public.pgtest_slow_update() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(%f); RETURN NULL; END $$`, d.Seconds()))
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TRIGGER pgtest_slow_update AFTER UPDATE ON ` + table + `
		FOR EACH STATEMENT EXECUTE FUNCTION public.pgtest_slow_update()`)
	require.NoError(t, err)
}
