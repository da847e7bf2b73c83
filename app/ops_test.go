package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestOps_AdminAndMetricsOnlyOnTheInternalListener: a catalog process serves
// /metrics and /admin on ADMIN_ADDR only (the public HTTP_ADDR answers 404),
// and while its database refuses connections the public /readyz names the
// component only, when the internal one shows the server's error.
func TestOps_AdminAndMetricsOnlyOnTheInternalListener(t *testing.T) {
	t.Parallel()
	const admin, feed = "ops-admin-token-0123", "ops-feed-token-01234"
	url := pgtest.DatabaseURL(t)
	db := pgtest.Open(t, url)
	public, internal := freeAddr(t), freeAddr(t)
	env := envOf("DATABASE_URL="+url, "KAFKA_BROKERS="+strings.Join(kafkatest.Brokers(t), ","), "LOG_LEVEL=warn",
		"HTTP_ADDR="+public, "ADMIN_ADDR="+internal, "CATALOG_ADMIN_TOKEN="+admin, "CATALOG_FEED_TOKEN="+feed,
		"PROMOTION_TOPIC="+kafkatest.Topic(t, 1), "CATALOG_DLQ_TOPIC="+kafkatest.Topic(t, 1), "CATALOG_REPLAY_TOPIC="+kafkatest.Topic(t, 1),
		"CATALOG_CONSUMER_GROUP=pf-test-ops-"+kafkatest.RandomSuffix(), "KAFKA_CREATE_TOPICS=false")
	proc := startCommand(t, env, "catalog")
	proc.waitReady(t, public)

	get := func(method, addr, path, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+path, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err, "%s %s%s", method, addr, path)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	for _, call := range [][3]string{{"GET", "/metrics", ""}, {"GET", "/admin/projections/rebuild", admin},
		{"POST", "/admin/projections/rebuild", admin}} {
		code, body := get(call[0], public, call[1], call[2])
		require.Equal(t, http.StatusNotFound, code, "public listener: %s %s must not be served: %.200s", call[0], call[1], body)
	}
	code, body := get("GET", internal, "/metrics", "")
	require.Equal(t, http.StatusOK, code, "internal listener: /metrics")
	require.Contains(t, body, "catalog_promotion_consumed_total")
	code, body = get("GET", internal, "/admin/projections/rebuild", admin)
	require.Equal(t, http.StatusOK, code, "internal listener: the rebuild's status with the admin token: %s", body)
	code, _ = get("GET", internal, "/admin/projections/rebuild", feed)
	require.Equal(t, http.StatusUnauthorized, code, "the feed's token is not the admin token")

	// The database refuses every new session, and the process's are ended
	// (from the server's maintenance database: a database cannot close itself).
	var name string
	require.NoError(t, db.Get(&name, `SELECT current_database()`))
	server, err := sqlx.Open("postgres", os.Getenv("DATABASE_URL"))
	require.NoError(t, err)
	t.Cleanup(func() { server.Close() })
	_, err = server.Exec(fmt.Sprintf(`ALTER DATABASE %q WITH ALLOW_CONNECTIONS false`, name))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = server.Exec(fmt.Sprintf(`ALTER DATABASE %q WITH ALLOW_CONNECTIONS true`, name)) })
	_, err = server.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, name)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		code, body := get("GET", internal, "/readyz", "")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "not currently accepting connections")
	}, 30*time.Second, 100*time.Millisecond, "the internal /readyz shows the server's error")
	code, body = get("GET", public, "/readyz", "")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.JSONEq(t, `{"status":"unavailable","reason":"database"}`, body, "the public /readyz names the component only")
}
