package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// A server's life for the tests of failover and restore: a streaming standby
// (pg_basebackup -R), its promotion, a crash of the primary, replication cut
// and healed, and a database copied into another cluster by pg_dump.

// StartStandby starts a streaming standby of s, named name (its
// application_name in the primary's pg_stat_replication, which
// synchronous_standby_names matches), from a fresh base backup. It is a hot
// standby: it answers reads, and writes fail with 25006. It is stopped and
// removed at cleanup.
func (s *Server) StartStandby(t testing.TB, name string) *Server {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgtest-standby-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	owner := ownFolder(t, dir)
	data := filepath.Join(dir, "data")
	if out, err := owner.command(dir, filepath.Join(s.bindir, "pg_basebackup"), "-D", data, "-R", "-X", "stream",
		"-c", "fast", "-h", s.Host, "-p", strconv.Itoa(s.Port), "-U", "postgres").CombinedOutput(); err != nil {
		t.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
	st := &Server{Host: s.Host, Dir: dir, CA: s.CA, owner: owner, bindir: s.bindir, data: data,
		logFile: filepath.Join(dir, "postgresql.log")}
	// Written last in postgresql.auto.conf, so that it wins over the line
	// pg_basebackup wrote, and so that Detach can change it (a setting given
	// on the command line would win over ALTER SYSTEM).
	conninfo := st.primaryConninfo(s, name)
	f, err := os.OpenFile(filepath.Join(data, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = fmt.Fprintf(f, "primary_conninfo = '%s'\n", conninfo)
	require.NoError(t, errors.Join(err, f.Close()))
	// The primary's settings: a standby refuses to replay with lower limits
	// (max_connections and the like) than its primary's.
	settings := maps.Clone(s.settings)
	settings["unix_socket_directories"] = dir
	settings["hot_standby"] = "on"
	st.start(t, settings)
	st.conninfo = conninfo
	return st
}

// primaryConninfo is a standby's primary_conninfo for primary.
func (s *Server) primaryConninfo(primary *Server, name string) string {
	return fmt.Sprintf("host=%s port=%d user=postgres application_name=%s", primary.Host, primary.Port, name)
}

// Promote makes a standby a primary (pg_ctl promote) and returns once it
// accepts writes.
func (s *Server) Promote(t testing.TB) {
	t.Helper()
	if out, err := s.owner.command(s.Dir, filepath.Join(s.bindir, "pg_ctl"), "-D", s.data, "-w", "-t", "60",
		"promote").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(s.logFile)
		t.Fatalf("pg_ctl promote: %v\n%s\n%s", err, out, log)
	}
}

// Kill stops the server as a crash of its machine would (an immediate
// shutdown: no checkpoint, every client cut), and leaves it stopped.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	if out, err := s.owner.command(s.Dir, filepath.Join(s.bindir, "pg_ctl"), "-D", s.data, "-m", "immediate", "-w",
		"stop").CombinedOutput(); err != nil {
		t.Fatalf("pg_ctl stop -m immediate: %v\n%s", err, out)
	}
}

// Detach cuts a standby off from its primary: it stops receiving WAL, so what
// the primary commits from now on is not on the standby, as under a lag or a
// partition. It returns once the standby's WAL receiver has stopped.
func (s *Server) Detach(t testing.TB) {
	t.Helper()
	s.setConninfo(t, "")
	db := s.OpenDatabase(t, "postgres")
	require.Eventually(t, func() bool {
		var n int
		return db.Get(&n, `SELECT count(*) FROM pg_stat_wal_receiver`) == nil && n == 0
	}, 30*time.Second, 20*time.Millisecond, "the standby's WAL receiver stops")
}

// Attach reconnects a standby that Detach cut off.
func (s *Server) Attach(t testing.TB) {
	t.Helper()
	s.setConninfo(t, s.conninfo)
}

func (s *Server) setConninfo(t testing.TB, conninfo string) {
	t.Helper()
	require.NotEmpty(t, s.conninfo, "not a standby of StartStandby")
	s.Reconfigure(t, map[string]string{"primary_conninfo": conninfo})
}

// Reconfigure sets server settings with ALTER SYSTEM and reloads the
// configuration, e.g. {"synchronous_standby_names": "s1"}.
func (s *Server) Reconfigure(t testing.TB, settings map[string]string) {
	t.Helper()
	db := s.OpenDatabase(t, "postgres")
	for name, value := range settings {
		_, err := db.Exec(fmt.Sprintf(`ALTER SYSTEM SET %s = %s`, name, quoteLiteral(value)))
		require.NoError(t, err, "ALTER SYSTEM SET %s", name)
	}
	_, err := db.Exec(`SELECT pg_reload_conf()`)
	require.NoError(t, err)
}

// WaitReplayed waits until standby has replayed everything that s, its
// primary, has written so far.
func (s *Server) WaitReplayed(t testing.TB, standby *Server) {
	t.Helper()
	primary := s.OpenDatabase(t, "postgres")
	replica := standby.OpenDatabase(t, "postgres")
	var lsn string
	require.NoError(t, primary.Get(&lsn, `SELECT pg_current_wal_insert_lsn()::text`))
	require.Eventually(t, func() bool {
		var done bool
		err := replica.Get(&done, `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, lsn)
		return err == nil && done
	}, 60*time.Second, 10*time.Millisecond, "the standby replays up to %s", lsn)
}

// CopyDatabase copies database from of server s into a new database to of
// server dst with pg_dump and psql, as a restore into another cluster does:
// the rows and sequences come along, the transaction ids do not.
func (s *Server) CopyDatabase(t testing.TB, from string, dst *Server, to string) {
	t.Helper()
	_, err := dst.OpenDatabase(t, "postgres").Exec(`CREATE DATABASE ` + quoteIdent(to))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dump := exec.CommandContext(ctx, filepath.Join(s.bindir, "pg_dump"), "--no-owner",
		fmt.Sprintf("host=%s port=%d user=postgres dbname=%s sslmode=disable", s.Host, s.Port, from))
	restore := exec.CommandContext(ctx, filepath.Join(s.bindir, "psql"), "-q", "-v", "ON_ERROR_STOP=1",
		fmt.Sprintf("host=%s port=%d user=postgres dbname=%s sslmode=disable", dst.Host, dst.Port, to))
	pipe, err := dump.StdoutPipe()
	require.NoError(t, err)
	restore.Stdin = pipe
	var dumpErr, restoreOut bytes.Buffer
	dump.Stderr = &dumpErr
	restore.Stdout, restore.Stderr = &restoreOut, &restoreOut
	require.NoError(t, dump.Start())
	restoreErr := restore.Run()
	require.NoError(t, dump.Wait(), "pg_dump: %s", dumpErr.String())
	require.NoError(t, restoreErr, "psql: %s", restoreOut.String())
}

// OpenDatabase opens database name of s as it is, without migrating it
// (a standby refuses writes), and closes it at cleanup.
func (s *Server) OpenDatabase(t testing.TB, name string) *sqlx.DB {
	t.Helper()
	db, err := open(fmt.Sprintf("postgres://postgres@%s:%d/%s?sslmode=disable", s.Host, s.Port, name))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

func quoteLiteral(s string) string { return quote(s, '\'') }

func quoteIdent(s string) string { return quote(s, '"') }

// quote wraps s in q, doubling each q inside.
func quote(s string, q byte) string {
	out := []byte{q}
	for i := 0; i < len(s); i++ {
		if s[i] == q {
			out = append(out, q)
		}
		out = append(out, s[i])
	}
	return string(append(out, q))
}
