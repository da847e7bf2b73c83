package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// migratedDatabaseURL is a database of the test's own with this release's
// migrations applied, as `promoflow migrate up` leaves it before a release's
// processes start.
func migratedDatabaseURL(t *testing.T) string {
	t.Helper()
	url := pgtest.DatabaseURL(t)
	// Its sessions are named as those of `promoflow migrate up`: a test that
	// looks at the server's sessions tells them from the processes'.
	db, err := sqlmigrate.OpenAs(url, applicationName("migrate"))
	require.NoError(t, err)
	defer db.Close()
	_, err = sqlmigrate.Up(t.Context(), db)
	require.NoError(t, err)
	return url
}

// promotionEnv is the settings of a promotion process on url, on a topic of
// the test's own, serving at addr.
func promotionEnv(t *testing.T, url, addr string) map[string]string {
	topic := "pf-test-" + kafkatest.RandomSuffix()
	kafkatest.CleanupTopic(t, topic)
	return envOf("DATABASE_URL="+url, "KAFKA_BROKERS="+strings.Join(kafkatest.Brokers(t), ","), "HTTP_ADDR="+addr,
		"PROMOTION_TOPIC="+topic, "KAFKA_TOPIC_PARTITIONS=1", "PROMOTION_API_TOKENS=tenant-one-token-01=0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b")
}

// TestMigrate_RefusesASchemaThatNoLongerAllowsIt: a contract migration whose
// compatible_from is above this release makes a starting process refuse,
// naming both versions, and turns a running one's /readyz false.
func TestMigrate_RefusesASchemaThatNoLongerAllowsIt(t *testing.T) {
	t.Parallel()
	url := migratedDatabaseURL(t)
	db := pgtest.OpenAsIs(t, url)
	addr := freeAddr(t)
	running := startCommand(t, promotionEnv(t, url, addr), "promotion")
	running.waitReady(t, addr)

	_, err := db.Exec(`INSERT INTO public.promoflow_migrations (version, compatible_from) VALUES ('0999_future_contract', '9.9.9')`)
	require.NoError(t, err)
	want := "this is promoflow " + Version + "; the schema needs 9.9.9 or later (migration 0999_future_contract is a contract migration): run a newer release"

	code, out := runCommand(t, promotionEnv(t, url, freeAddr(t)), time.Minute, "promotion")
	require.NotEqual(t, 0, code, "a promotion process started on a schema that needs 9.9.9:\n%s", out)
	require.Contains(t, out, want)

	var reason string
	require.Eventually(t, func() bool {
		var status int
		status, reason = readyzReason(internalOf(addr))
		return status == http.StatusServiceUnavailable
	}, 3*schemaCheckInterval, 200*time.Millisecond, "/readyz of the running process stays ready on a schema that needs 9.9.9")
	require.Contains(t, reason, want, "the internal /readyz names both versions")
	_, reason = readyzReason(addr)
	require.Equal(t, "schema", reason, "the public /readyz names the component only")
}

// TestMigrate_RefusesASchemaOlderThanItNeeds: a schema without this
// release's newest migration is refused, naming the migration and `promoflow
// migrate up`; once that ran, the process starts.
func TestMigrate_RefusesASchemaOlderThanItNeeds(t *testing.T) {
	t.Parallel()
	// The schema lacks one migration: its row is removed, and it is one that
	// applies again over what it did (ADD COLUMN IF NOT EXISTS), so that
	// migrate up can apply it once more.
	const newest = "0021_migrations_compatible_from"
	url := migratedDatabaseURL(t)
	db := pgtest.OpenAsIs(t, url)
	res, err := db.Exec(`DELETE FROM public.promoflow_migrations WHERE version = $1`, newest)
	require.NoError(t, err)
	n, err := res.RowsAffected()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "migration %s is not among the applied ones", newest)

	code, out := runCommand(t, promotionEnv(t, url, freeAddr(t)), time.Minute, "promotion")
	require.NotEqual(t, 0, code, "a promotion process started on a schema without %s:\n%s", newest, out)
	require.Contains(t, out, "the schema lacks 1 migrations this release needs ("+newest+"): run `promoflow migrate up` with this release first")

	code, out = runCommand(t, envOf("DATABASE_URL="+url), time.Minute, "migrate", "up")
	require.Equal(t, 0, code, out)
	addr := freeAddr(t)
	startCommand(t, promotionEnv(t, url, addr), "promotion").waitReady(t, addr)
}

// TestMigrate_ReadOnlyCommandsNeverMigrate: status, audit and dlq list on a
// database without the schema, or with an old one, apply nothing, and the
// ones that read the database say what to run.
func TestMigrate_ReadOnlyCommandsNeverMigrate(t *testing.T) {
	t.Parallel()
	all, err := sqlmigrate.All()
	require.NoError(t, err)
	newest := all[len(all)-1].Version
	empty := pgtest.DatabaseURL(t)
	old := migratedDatabaseURL(t)
	oldDB := pgtest.OpenAsIs(t, old)
	_, err = oldDB.Exec(`DELETE FROM public.promoflow_migrations WHERE version = $1`, newest)
	require.NoError(t, err)
	emptyDB := pgtest.OpenAsIs(t, empty)

	brokers := "KAFKA_BROKERS=" + strings.Join(kafkatest.Brokers(t), ",")
	for _, c := range []struct {
		url, says string
	}{
		{empty, "the database has no promoflow schema (no migrations table; this release needs"},
		{old, "the schema lacks 1 migrations this release needs (" + newest + "): run `promoflow migrate up` with this release first"},
	} {
		env := envOf("DATABASE_URL="+c.url, brokers, "CATALOG_DLQ_TOPIC=pf-test-dlq-"+kafkatest.RandomSuffix())
		for _, args := range [][]string{{"status"}, {"audit"}} {
			code, out := runCommand(t, env, time.Minute, args...)
			require.NotEqual(t, 0, code, "promoflow %s:\n%s", args[0], out)
			require.Contains(t, out, c.says, "promoflow %s", args[0])
		}
		_, out := runCommand(t, env, time.Minute, "dlq", "list")
		require.NotContains(t, out, "migrations applied", "promoflow dlq list")
	}
	var exists bool
	require.NoError(t, emptyDB.QueryRow(`SELECT to_regclass('public.promoflow_migrations') IS NOT NULL`).Scan(&exists))
	require.False(t, exists, "a read-only command created the migrations table on an empty database")
	st, err := sqlmigrate.Status(t.Context(), oldDB.DB)
	require.NoError(t, err)
	require.False(t, st[newest], "a read-only command applied %s on an old schema", newest)
}

// readyzReason is the status and the reason /readyz of the process at addr
// answers.
func readyzReason(addr string) (int, string) {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r struct{ Reason string }
	_ = json.Unmarshal(body, &r)
	return resp.StatusCode, r.Reason
}
