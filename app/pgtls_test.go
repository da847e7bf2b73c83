package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// tlsOnlyHBA refuses every connection without TLS.
var tlsOnlyHBA = []string{"hostssl all all 127.0.0.1/32 trust"}

// TestPostgresTLS_VerifyFull runs the promotion process against a server that
// takes TLS connections only, with a certificate from the test's own CA, and
// a password: with sslmode=verify-full, that CA as sslrootcert and the
// password in a mounted file (passfile) it connects, migrates and serves a
// purchase; every connection it holds is encrypted, and the password appears
// nowhere in what it prints.
func TestPostgresTLS_VerifyFull(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartServer(t, pgtest.ServerOptions{TLS: true,
		HBA: []string{"local all all trust", "hostssl all all 127.0.0.1/32 scram-sha-256"}})
	password := "pw-" + pgtest.RandomSuffix()
	admin := openTest(t, srv.SocketDSN())
	_, err := admin.Exec(`ALTER ROLE postgres PASSWORD '` + password + `'`)
	require.NoError(t, err)
	passfile := filepath.Join(t.TempDir(), "pgpass")
	require.NoError(t, os.WriteFile(passfile, []byte("*:*:*:postgres:"+password+"\n"), 0o600))
	dbURL := srv.URL("sslmode=verify-full&sslrootcert=" + srv.CA.WriteFile(t) + "&passfile=" + passfile +
		"&application_name=promoflow-tls")
	topic := "pf-test-" + kafkatest.RandomSuffix()
	kafkatest.CleanupTopic(t, topic)
	addr := freeAddr(t)
	p := startCommand(t, envOf([]string{"DATABASE_URL=" + dbURL, "KAFKA_BROKERS=" + strings.Join(kafkatest.Brokers(t), ","), "MIGRATE_ON_START=true"}...),
		"promotion", "--http-addr", addr, "--topic", topic, "--topic-partitions", "1",
		"--api-tokens", "tenant-one-token-01=0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b")
	p.waitReady(t, addr)
	createPurchase(t, addr, "tenant-one-token-01", time.Hour)

	db := openTest(t, dbURL)
	status, err := sqlmigrate.Status(context.Background(), db.DB)
	require.NoError(t, err)
	for version, applied := range status {
		require.True(t, applied, "migration %s applied through verify-full", version)
	}
	var plain, encrypted int
	require.NoError(t, db.QueryRowx(`SELECT count(*) FILTER (WHERE NOT s.ssl), count(*) FILTER (WHERE s.ssl)
		FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = 'promoflow-tls' AND a.pid <> pg_backend_pid()`).
		Scan(&plain, &encrypted))
	require.Zero(t, plain, "connections without TLS")
	require.Positive(t, encrypted, "the process's connections, over TLS")
	require.NotContains(t, p.out.String(), password)
}

// TestPostgresTLS_WrongCAIsRefused: a server certificate that the configured
// CA did not sign ends the process at once, non-zero, with a message that
// names the certificate problem; it does not wait for the server to change.
func TestPostgresTLS_WrongCAIsRefused(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartServer(t, pgtest.ServerOptions{TLS: true, HBA: tlsOnlyHBA})
	wrongCA := pgtest.NewCA(t, "another CA").WriteFile(t)
	p := startCommand(t, envOf([]string{"DATABASE_URL=" + srv.URL("sslmode=verify-full&sslrootcert="+wrongCA),
		"KAFKA_BROKERS=" + strings.Join(kafkatest.Brokers(t), ",")}...),
		"promotion", "--http-addr", freeAddr(t), "--topic", "pf-test-"+kafkatest.RandomSuffix())

	require.Equal(t, 1, p.exitCode(t, 2*databaseWaitDefault))
	out := p.out.String()
	t.Logf("printed:\n%s", out)
	require.Contains(t, out, "promoflow: connect to database: the server's certificate is not trusted (check sslrootcert)")
	require.Contains(t, out, "x509: certificate signed by unknown authority")
	require.NotContains(t, out, "database not ready, retrying", "a certificate problem is not waited out")
}

// openTest is a handle on dbURL, opened as the processes open theirs.
func openTest(t *testing.T, dbURL string) *sqlx.DB { return pgtest.OpenAsIs(t, dbURL) }
