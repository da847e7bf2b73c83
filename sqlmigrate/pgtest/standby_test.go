package pgtest_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestStandby_FollowsDetachesAndPromotes shows what the failover tests rely
// on: a standby replays what its primary commits, misses what the primary
// commits while it is detached, and accepts writes once promoted.
func TestStandby_FollowsDetachesAndPromotes(t *testing.T) {
	primary := pgtest.StartServer(t, pgtest.ServerOptions{})
	p := primary.OpenDatabase(t, "postgres")
	_, err := p.Exec(`CREATE TABLE t (n int)`)
	require.NoError(t, err)
	standby := primary.StartStandby(t, "s1")
	s := standby.OpenDatabase(t, "postgres")
	_, err = p.Exec(`INSERT INTO t VALUES (1)`)
	require.NoError(t, err)
	primary.WaitReplayed(t, standby)
	var n int
	require.NoError(t, s.Get(&n, `SELECT count(*) FROM t`))
	require.Equal(t, 1, n, "the standby replays the primary's commit")
	_, err = s.Exec(`INSERT INTO t VALUES (9)`)
	require.ErrorContains(t, err, "read-only", "a hot standby refuses writes")

	standby.Detach(t)
	_, err = p.Exec(`INSERT INTO t VALUES (2)`)
	require.NoError(t, err)
	primary.Kill(t)
	standby.Promote(t)
	require.NoError(t, s.Get(&n, `SELECT count(*) FROM t`))
	require.Equal(t, 1, n, "what the primary committed while the standby was detached is not on it")
	_, err = s.Exec(`INSERT INTO t VALUES (3)`)
	require.NoError(t, err, "a promoted standby accepts writes")
}

// TestCopyDatabase_MovesRowsIntoAnotherCluster shows a restore into a fresh
// cluster: the rows come along, under another system identifier.
func TestCopyDatabase_MovesRowsIntoAnotherCluster(t *testing.T) {
	a := pgtest.StartServer(t, pgtest.ServerOptions{})
	b := pgtest.StartServer(t, pgtest.ServerOptions{})
	_, err := a.OpenDatabase(t, "postgres").Exec(`CREATE DATABASE src`)
	require.NoError(t, err)
	src := a.OpenDatabase(t, "src")
	_, err = src.Exec(`CREATE TABLE t (n int); INSERT INTO t VALUES (1), (2)`)
	require.NoError(t, err)
	a.CopyDatabase(t, "src", b, "dst")
	dst := b.OpenDatabase(t, "dst")
	var n int
	require.NoError(t, dst.Get(&n, `SELECT count(*) FROM t`))
	require.Equal(t, 2, n)
	var ida, idb string
	require.NoError(t, src.Get(&ida, `SELECT system_identifier::text FROM pg_control_system()`))
	require.NoError(t, dst.Get(&idb, `SELECT system_identifier::text FROM pg_control_system()`))
	require.NotEqual(t, ida, idb, "another cluster")
}
