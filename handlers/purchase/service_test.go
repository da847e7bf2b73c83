package purchase_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/purchase"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

func TestIdempotencyKeys_ExpireAfterRetention(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	svc, err := purchase.NewService(db, purchase.ServiceConfig{IdempotencyRetention: time.Hour})
	require.NoError(t, err)
	ctx := context.Background()
	tenant := uuid.New()
	d := draft()
	d.StartsAt, d.EndsAt = time.Now(), time.Now().Add(time.Hour)

	first, replayed, err := svc.Create(ctx, tenant, "k-1", d, "test")
	require.NoError(t, err)
	require.False(t, replayed)
	again, replayed, err := svc.Create(ctx, tenant, "k-1", d, "test")
	require.NoError(t, err)
	require.True(t, replayed, "within the retention the key returns the first purchase")
	require.Equal(t, first.ID, again.ID)

	// The key ages past the retention: it is free again, even before cleanup.
	_, err = db.Exec(`UPDATE promotion.idempotency_keys SET created_at = now() - interval '61 minutes'`)
	require.NoError(t, err)
	second, replayed, err := svc.Create(ctx, tenant, "k-1", d, "test")
	require.NoError(t, err)
	require.False(t, replayed)
	require.NotEqual(t, first.ID, second.ID)

	// The janitor deletes keys past the retention and nothing younger.
	_, err = db.Exec(`INSERT INTO promotion.idempotency_keys (tenant_id, key, request_hash, purchase_id, created_at)
		VALUES ($1, 'old', '\x00', $2, now() - interval '2 hours')`, tenant, first.ID)
	require.NoError(t, err)
	n, err := purchase.CleanupIdempotencyKeys(ctx, db, time.Hour)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	var keys []string
	require.NoError(t, db.Select(&keys, `SELECT key FROM promotion.idempotency_keys ORDER BY key`))
	require.Equal(t, []string{"k-1"}, keys)
}
