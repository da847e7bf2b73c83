package main

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDatabase_UnverifiedTLSWarns: outside dev, a DATABASE_URL to another
// machine whose sslmode is below verify-full (none given is lib/pq's
// require, which accepts any certificate) logs a WARN that names the risk;
// verify-full, a loopback host or a unix socket, DATABASE_TLS_INSECURE_OK and
// dev log none.
func TestDatabase_UnverifiedTLSWarns(t *testing.T) {
	warned := func(c commonConfig) string {
		var buf bytes.Buffer
		warnDatabaseTLS(c, slog.New(slog.NewTextHandler(&buf, nil)))
		return buf.String()
	}
	for url, want := range map[string]string{
		"postgres://app@db.example:5432/promoflow":                         "sslmode=require does not check the server's host name",
		"postgres://app@db.example:5432/promoflow?sslmode=require":         "sslmode=require does not check the server's host name",
		"postgres://app@db.example:5432/promoflow?sslmode=verify-ca":       "sslmode=verify-ca does not check the server's host name",
		"postgres://app@10.0.0.7:5432/promoflow?sslmode=disable":           "sslmode=disable: the connection may be unencrypted",
		"postgres://app@127.0.0.1,db.example:5432/promoflow?sslmode=allow": "sslmode=allow: the connection may be unencrypted",
	} {
		out := warned(commonConfig{DatabaseURL: url})
		require.Contains(t, out, "level=WARN", "%s warns", url)
		require.Contains(t, out, want, "%s names its risk", url)
		require.Contains(t, out, "DATABASE_TLS_INSECURE_OK", "%s says how to silence it", url)
		require.Empty(t, warned(commonConfig{DatabaseURL: url, DatabaseTLSInsecureOK: true}), "%s with DATABASE_TLS_INSECURE_OK", url)
		require.Empty(t, warned(commonConfig{DatabaseURL: url, dev: true}), "%s in dev", url)
	}
	for _, url := range []string{
		"postgres://app@db.example:5432/promoflow?sslmode=verify-full&sslrootcert=/etc/ca.crt",
		"postgres://app@127.0.0.1:5432/promoflow?sslmode=disable",
		"postgres://app@localhost:5432/promoflow",
		"postgres://app@[::1]:5432/promoflow?sslmode=disable",
		"host=/var/run/postgresql dbname=promoflow sslmode=disable",
	} {
		require.Empty(t, warned(commonConfig{DatabaseURL: url}), "%s is not warned", url)
	}
}
