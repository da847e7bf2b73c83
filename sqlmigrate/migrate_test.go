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
