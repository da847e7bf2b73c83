package router_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/logtest"
	"github.com/promoflow/promoflow/handlers/purchase"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// The wake-up tests run before the parallel tests (they do not call
// t.Parallel), so that the load of those on the shared cluster does not eat
// into the bound.

// expiryBound is the wake-up's accuracy target: Expired within 1.5s of EndsAt.
const expiryBound = 1500 * time.Millisecond

// heartbeat is the production interval: within a test, the ticker ticks only
// at start, so every later cycle is a wake-up's.
const heartbeat = 60 * time.Second

func TestExpirer_WakesAtEarliestEndsAt(t *testing.T) {
	b := promotionBundle{db: pgtest.DB(t), topic: kafkatest.Topic(t, 1)}
	b.start(t, heartbeat)

	p := createEndingIn(t, purchasetest.NewService(t, b.db, b.topic), time.Second)

	asOf := waitExpired(t, b.db, p)
	require.Eventually(t, func() bool { n, _ := histogramCountSum(t, b.metrics.ExpireDelay); return n == 1 }, 10*time.Second, 5*time.Millisecond,
		"promotion_expire_delay_seconds observed the expiry")
	require.False(t, asOf.Before(p.EndsAt), "never expired before EndsAt")
}

func TestExpirer_EarlierPurchaseCreatedOnOtherInstanceRearmsWakeup(t *testing.T) {
	url := pgtest.DatabaseURL(t)
	topic := kafkatest.Topic(t, 1)
	a := promotionBundle{db: pgtest.Open(t, url), topic: topic}
	other := promotionBundle{db: pgtest.Open(t, url), topic: topic}
	far := purchasetest.SeedActive(t, a.db, 1, time.Now().Add(time.Hour))[0]

	logsA := &logtest.Logs{}
	a.startWith(t, heartbeat, expire.Config{}, logsA.Logger())
	// Instance B has no wake-up of its own: only A's re-arm can expire the
	// new purchase within the bound, once B's ticker has run its first cycle
	// (at start; the next is a heartbeat away).
	logsB := &logtest.Logs{}
	other.startWith(t, heartbeat, expire.Config{DisableWakeup: true}, logsB.Logger())
	require.Eventually(t, func() bool { return len(logsB.Find(slog.LevelInfo, "cycle completed")) > 0 },
		30*time.Second, 10*time.Millisecond, "instance B ran its first cycle")
	var farEndsAt time.Time
	require.NoError(t, a.db.Get(&farEndsAt, `SELECT ends_at FROM promotion.promotion_purchases WHERE id = $1`, far))
	require.Eventually(t, func() bool {
		armed := logsA.Find(slog.LevelDebug, "expire wake-up armed")
		return len(armed) > 0 && armed[len(armed)-1]["EndsAt"] == farEndsAt.UTC().String()
	}, 30*time.Second, 10*time.Millisecond, "instance A is armed for the far EndsAt")

	p := createEndingIn(t, purchasetest.NewService(t, other.db, other.topic), time.Second)

	waitExpired(t, a.db, p)
	// The expirer logs each purchase once its batch committed, a moment
	// after the row reads Expired.
	expiredBy := func(logs *logtest.Logs) bool {
		for _, l := range logs.Find(slog.LevelInfo, "promotion expired") {
			if l["PurchaseId"] == p.ID.String() {
				return true
			}
		}
		return false
	}
	require.Eventually(t, func() bool { return expiredBy(logsA) || expiredBy(logsB) }, 10*time.Second, 5*time.Millisecond,
		"an instance logged the expiry")
	require.True(t, expiredBy(logsA), "instance A expired the purchase created on B")
	require.Equal(t, event.StatusActive, purchasetest.Statuses(t, a.db)[far].Status)
}

// createEndingIn creates a purchase through the API's use case, ending in d.
func createEndingIn(t *testing.T, svc *purchase.Service, d time.Duration) purchase.Purchase {
	t.Helper()
	p, _, err := svc.Create(context.Background(), uuid.New(), "", purchase.Draft{PackageKind: "Top", BoostWeight: 10,
		Targets: []event.Target{catalogtest.Target(event.TargetProject, uuid.New())}, EndsAt: time.Now().Add(d)}, "test")
	require.NoError(t, err)
	return p
}

// waitExpired waits until p is Expired, at most expiryBound past its EndsAt,
// and returns the cycle's AsOf (its UpdatedAt).
func waitExpired(t *testing.T, db *sqlx.DB, p purchase.Purchase) time.Time {
	t.Helper()
	var row struct {
		Status    event.Status `db:"status"`
		UpdatedAt time.Time    `db:"updated_at"`
	}
	require.Eventually(t, func() bool {
		err := db.Get(&row, `SELECT status, updated_at FROM promotion.promotion_purchases WHERE id = $1`, p.ID)
		return err == nil && row.Status == event.StatusExpired
	}, time.Until(p.EndsAt.Add(expiryBound)), 5*time.Millisecond, "Expired within %s of EndsAt", expiryBound)
	return row.UpdatedAt
}

// histogramCountSum is how many samples h observed, and their sum.
func histogramCountSum(t testing.TB, h prometheus.Histogram) (uint64, float64) {
	t.Helper()
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(h))
	families, err := reg.Gather()
	require.NoError(t, err)
	got := families[0].GetMetric()[0].GetHistogram()
	return got.GetSampleCount(), got.GetSampleSum()
}
