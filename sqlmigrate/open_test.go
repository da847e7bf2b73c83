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

// TestOpen_AnUnparsableDSNIsReportedWithoutAnyOfIt: a DSN that lib/pq cannot
// parse is reported by its form and what is wrong with it, never with any
// of its text, which may hold a password (lib/pq said `missing "=" after
// "h0rse-b4ttery"` of a password with a space, net/url `invalid port
// ":Tr0u" after host` of one with a slash, `invalid URL escape "%zz"`).
func TestOpen_AnUnparsableDSNIsReportedWithoutAnyOfIt(t *testing.T) {
	t.Parallel()
	const password = "Tr0ub4dor"
	cut := func(sep string) string { return password[:4] + sep + password[4:] }
	for _, c := range []struct {
		dsn, want string
		// fragments of the DSN that the error must not hold, besides any
		// four characters of the password in a row
		fragments []string
	}{
		{"host=db password=" + password + " h0rse-b4ttery dbname=promoflow",
			`key=value connection string does not parse: setting 3 has no "=" after its name`, []string{"h0rse"}},
		{"host=db password='" + password + " dbname=promoflow",
			"key=value connection string does not parse: the value of setting 2 opens a quote that does not close", nil},
		{"host=db password=" + password + `\`,
			"key=value connection string does not parse: the value of setting 2 ends in a backslash", nil},
		{"host=db password=" + password + " port=54x32",
			"key=value connection string: lib/pq does not take the value of port", []string{"54x32"}},
		{"postgres://promoflow:" + cut("/") + "@db:5432/promoflow",
			"URL does not parse: its user name, password, host or port is malformed", nil},
		{"postgres://promoflow:" + cut("#") + "@db/promoflow",
			"URL does not parse: its user name, password, host or port is malformed", nil},
		{"postgres://promoflow:" + cut("%zz") + "@db/promoflow",
			"URL does not parse: a % that does not start a two-digit hex escape", []string{"%zz"}},
		{"postgres://promoflow:" + password + "@db/promoflow?sslmode=verify_full",
			"URL: lib/pq does not take the value of sslmode", []string{"verify_full"}},
		{"postgres://promoflow:" + password + "@db/promoflow?sslnegotiation=direct&sslmode=prefer",
			"URL: lib/pq does not take its settings together", []string{`"prefer"`}},
	} {
		_, err := sqlmigrate.Open(c.dsn)
		require.Error(t, err, "for %q", c.dsn)
		fragments := c.fragments
		for i := 0; i+4 <= len(password); i++ {
			fragments = append(fragments, password[i:i+4])
		}
		for _, f := range fragments {
			require.NotContains(t, err.Error(), f, "the error for %q holds part of it", c.dsn)
		}
		require.ErrorContains(t, err, c.want, "for %q", c.dsn)
	}
	_, err := sqlmigrate.Open("postgres://promoflow:" + password + "@db/promoflow?sslmode=disable")
	require.NoError(t, err, "a DSN that parses opens (without connecting)")
}
