package expire_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
)

// databaseNow is PostgreSQL's clock.
func databaseNow(t *testing.T, db *sqlx.DB) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, db.Get(&now, `SELECT now()`))
	return now.UTC()
}

// TestExpirer_InstanceClockAheadDoesNotExpireEarly: the process's clock runs
// an hour ahead of PostgreSQL's. A purchase whose EndsAt is still ten minutes
// away by the database's clock stays Active; one that ended by it expires,
// and its delay is measured on that same clock (AsOf is the database's).
func TestExpirer_InstanceClockAheadDoesNotExpireEarly(t *testing.T) {
	b := setup(t, expire.Config{DisableWakeup: true})
	b.exp.Now = func() time.Time { return time.Now().Add(time.Hour) }
	start := databaseNow(t, b.db)
	paid := purchasetest.SeedActive(t, b.db, 1, start.Add(10*time.Minute))[0]
	endedAt := start.Add(-time.Second)
	ended := purchasetest.SeedActive(t, b.db, 1, endedAt)[0]

	res, err := b.exp.RunCycle(context.Background())
	require.NoError(t, err)

	states := purchasetest.Statuses(t, b.db)
	require.Equal(t, purchasetest.State{Status: event.StatusActive, Version: 1}, states[paid],
		"a purchase is never expired before its EndsAt by the database's clock")
	require.Equal(t, purchasetest.State{Status: event.StatusExpired, Version: 2}, states[ended])
	require.Equal(t, 1, res.ExpiredCount)
	require.False(t, res.AsOf.Before(start), "AsOf %s is the database's clock, not before %s", res.AsOf, start)
	end := databaseNow(t, b.db)
	require.False(t, res.AsOf.After(end), "AsOf %s is the database's clock, not after %s", res.AsOf, end)
	require.Equal(t, []time.Duration{res.AsOf.Sub(endedAt)}, res.Delays, "the delay is measured on AsOf's clock")
	events := purchasetest.OutboxEvents(t, b.db)
	require.Len(t, events, 1)
	require.Equal(t, ended, events[0].PurchaseId)
}
