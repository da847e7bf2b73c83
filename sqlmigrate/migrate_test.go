package sqlmigrate_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/sqlmigrate"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

func TestUp_ConcurrentMigratorsApplyEachMigrationOnce(t *testing.T) {
	t.Parallel()
	t.Run("direct", func(t *testing.T) { t.Parallel(); concurrentMigrators(t, pgtest.DatabaseURL(t)) })
	// No lock outlives a transaction, so migrators sharing a pooler's server
	// connections neither skip each other nor wait for ever.
	t.Run("pgbouncer", func(t *testing.T) {
		t.Parallel()
		concurrentMigrators(t, pgtest.StartPgBouncer(t, pgtest.PgBouncerOptions{Upstream: pgtest.DatabaseURL(t), PoolSize: 2}).URL())
	})
}

func concurrentMigrators(t *testing.T, url string) {
	all, err := sqlmigrate.All()
	require.NoError(t, err)

	var wg sync.WaitGroup
	applied := make(chan []string, 5)
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, err := sqlmigrate.Open(url)
			if err != nil {
				t.Error(err)
				return
			}
			defer db.Close()
			got, err := sqlmigrate.Up(context.Background(), db)
			if err != nil {
				t.Error(err)
			}
			applied <- got
		}()
	}
	wg.Wait()
	close(applied)
	total := 0
	for got := range applied {
		total += len(got)
	}
	require.Equal(t, len(all), total, "every migration applied by exactly one process")

	db, err := sqlmigrate.Open(url)
	require.NoError(t, err)
	defer db.Close()
	st, err := sqlmigrate.Status(context.Background(), db)
	require.NoError(t, err)
	for _, m := range all {
		require.True(t, st[m.Version], m.Version)
	}
	again, err := sqlmigrate.Up(context.Background(), db)
	require.NoError(t, err)
	require.Empty(t, again)
}

func TestStatus_OnAnEmptyDatabaseListsEveryMigrationAsPending(t *testing.T) {
	t.Parallel()
	db, err := sqlmigrate.Open(pgtest.DatabaseURL(t))
	require.NoError(t, err)
	defer db.Close()
	st, err := sqlmigrate.Status(context.Background(), db)
	require.NoError(t, err)
	require.NotEmpty(t, st)
	for v, done := range st {
		require.False(t, done, v)
	}
}

// TestUp_ADatabaseMigratedBeforeCompatibleFromGetsTheBaseline: on a database
// that a release before the compatible_from column migrated, Up applies only
// the column's migration; the rows already there say 0.1.0, so that release
// and this one pass Check, and an older one is refused.
func TestUp_ADatabaseMigratedBeforeCompatibleFromGetsTheBaseline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sqlmigrate.Open(pgtest.DatabaseURL(t))
	require.NoError(t, err)
	defer db.Close()
	all, err := sqlmigrate.All()
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `CREATE TABLE public.promoflow_migrations (
		version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	const column = "0021_migrations_compatible_from"
	// Every other migration counts as applied, the later ones too: the
	// database has none of the tables the earlier ones made, which a later
	// one may alter.
	for _, m := range all {
		if m.Version != column {
			_, err = db.ExecContext(ctx, `INSERT INTO public.promoflow_migrations (version) VALUES ($1)`, m.Version)
			require.NoError(t, err)
		}
	}
	var behind *sqlmigrate.SchemaBehindError
	require.ErrorAs(t, sqlmigrate.Check(ctx, db, "0.2.0"), &behind)
	require.Contains(t, behind.Missing, column)

	applied, err := sqlmigrate.Up(ctx, db)
	require.NoError(t, err)
	require.Contains(t, applied, column)
	var others int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM public.promoflow_migrations WHERE compatible_from <> '0.1.0'`).Scan(&others))
	require.Zero(t, others, "every row, those applied before the column included, allows 0.1.0")
	require.NoError(t, sqlmigrate.Check(ctx, db, "0.1.0"))
	require.NoError(t, sqlmigrate.Check(ctx, db, "0.2.0"))
	var tooNew *sqlmigrate.SchemaTooNewError
	require.ErrorAs(t, sqlmigrate.Check(ctx, db, "0.0.9"), &tooNew)
	require.Equal(t, "0.1.0", tooNew.Needs)
}
