// Package pgtest gives each test a migrated PostgreSQL database of its own on
// the real server named by DATABASE_URL (scripts/test.sh starts it). Nothing
// here fakes PostgreSQL.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/sqlmigrate"
)

func mustEnv(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("$%s is not set: run the tests with scripts/test.sh, which starts PostgreSQL and Kafka", name)
	}
	return v
}

// RandomSuffix is a short random hex string for names.
func RandomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// DatabaseURL creates an empty database for the test, dropped at cleanup, and
// returns its URL.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	return DatabaseURLOn(t, mustEnv(t, "DATABASE_URL"))
}

// DatabaseURLOn is DatabaseURL on the server of base, a database URL there
// (say a Server's).
func DatabaseURLOn(t testing.TB, base string) string {
	t.Helper()
	admin, err := open(base)
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })

	name := "pf_test_" + RandomSuffix()
	_, err = admin.Exec(`CREATE DATABASE ` + name)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`)
	})
	u, err := url.Parse(base)
	require.NoError(t, err)
	u.Path = "/" + name
	return u.String()
}

// DB is a migrated database of the test's own.
func DB(t testing.TB) *sqlx.DB {
	t.Helper()
	return Open(t, DatabaseURL(t))
}

// open opens url as the processes do (sqlmigrate.Open).
func open(url string) (*sqlx.DB, error) {
	db, err := sqlmigrate.Open(url)
	if err != nil {
		return nil, err
	}
	return sqlx.NewDb(db, "postgres"), nil
}

// Open is a handle of its own on the database at url, migrated: a second
// Open of one url is another process's view of the same database.
func Open(t testing.TB, url string) *sqlx.DB {
	t.Helper()
	db, err := open(url)
	require.NoError(t, err)
	db.SetMaxOpenConns(40)
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = sqlmigrate.Up(ctx, db.DB)
	require.NoError(t, err)
	return db
}

// OpenAsIs is a handle on the database at url, opened as the processes open
// theirs and not migrated (a standby or a read-only database refuses a
// migration's writes); it is closed at cleanup.
func OpenAsIs(t testing.TB, url string) *sqlx.DB {
	t.Helper()
	db, err := open(url)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}
