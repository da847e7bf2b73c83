package outbox_test

import (
	"database/sql"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestStandbyFlush_RefusesARoleThatCannotReadTheStandbysProgress: to a role
// without pg_read_all_stats every flush_lsn reads NULL, so the relay would
// wait for ever; it refuses such a role, naming the grant, and accepts it
// once granted pg_monitor.
func TestStandbyFlush_RefusesARoleThatCannotReadTheStandbysProgress(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartServer(t, pgtest.ServerOptions{})
	admin := srv.OpenDatabase(t, "postgres")
	_, err := admin.Exec(`CREATE ROLE relay LOGIN`)
	require.NoError(t, err)
	relay, err := pgtestOpenAs(t, srv, "relay")
	require.NoError(t, err)
	var standbys outbox.Standbys
	require.NoError(t, standbys.Set("replica1, replica2"))
	require.Equal(t, []string{"replica1", "replica2"}, standbys.Names)
	flush, err := outbox.NewStandbyFlush(relay, outbox.StandbyFlushConfig{Standbys: standbys})
	require.NoError(t, err)

	err = flush.CheckGrant(t.Context())
	require.ErrorIs(t, err, outbox.ErrStandbyStatsHidden)
	require.ErrorContains(t, err, "GRANT pg_read_all_stats (or pg_monitor)")

	_, err = admin.Exec(`GRANT pg_monitor TO relay`)
	require.NoError(t, err)
	require.NoError(t, flush.CheckGrant(t.Context()))
}

// pgtestOpenAs opens the server's postgres database as role.
func pgtestOpenAs(t *testing.T, srv *pgtest.Server, role string) (*sql.DB, error) {
	db, err := sql.Open("postgres", fmt.Sprintf("host=%s port=%d user=%s dbname=postgres sslmode=disable", srv.Host, srv.Port, role))
	if err == nil {
		t.Cleanup(func() { db.Close() })
	}
	return db, err
}
