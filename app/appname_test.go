package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestProcesses_NameTheirSessionsOnTheServer: each process's sessions carry
// its command's application_name, so an operator on a shared server (and
// `promoflow status`, which names the relay position's holder and the
// oldest outbox writer) tells them from every other client.
func TestProcesses_NameTheirSessionsOnTheServer(t *testing.T) {
	t.Parallel()
	p := startPipeline(t, map[string]string{"KAFKA_BROKERS": strings.Join(kafkatest.Brokers(t), ",")})
	db := openTest(t, p.env["DATABASE_URL"])
	names := func() map[string]bool {
		var got []string
		require.NoError(t, db.Select(&got, `SELECT DISTINCT application_name FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`))
		seen := map[string]bool{}
		for _, n := range got {
			seen[n] = true
		}
		return seen
	}
	require.Eventually(t, func() bool {
		n := names()
		return n["promoflow-promotion"] && n["promoflow-catalog"]
	}, 30*time.Second, 20*time.Millisecond, "the processes' sessions by name: %v", names())
	require.NotContains(t, names(), "", "a session of the processes without a name")

}

// TestApplicationName_IsTheCommandsUnlessTheURLNamesOne: a database URL's
// application_name or fallback_application_name wins over the command's.
func TestApplicationName_IsTheCommandsUnlessTheURLNamesOne(t *testing.T) {
	t.Parallel()
	base := pgtest.DatabaseURL(t)
	for _, c := range []struct{ query, want string }{
		{"", "promoflow-rebuild"},
		{"&application_name=ops", "ops"},
		{"&fallback_application_name=tool", "tool"},
	} {
		db, err := openPool(t.Context(), "rebuild", base+c.query, 2, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		var got string
		require.NoError(t, db.Get(&got, `SELECT current_setting('application_name')`))
		db.Close()
		require.Equal(t, c.want, got, "URL %q", c.query)
	}
}
