package audit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/catalogtest"
)

// TestAuditReplica_NewerReplicaVersionIsPendingNotDrift: the live consumer
// applies a purchase's version 2, and a new purchase's first event, after the
// replica check read the topic's end offsets and before it reads the replica.
// The replica is then newer than the topic the check read: pending, not
// drift. A replica version that no record on the topic has is still drift.
func TestAuditReplica_NewerReplicaVersionIsPendingNotDrift(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 7, catalogtest.Target(event.TargetProject, b.project))
	before := b.BoostOf(event.TargetProject, b.project)
	b.Produce(t, ev)
	b.WaitBoost(t, event.TargetProject, b.project, before+7)

	require.Eventually(t, func() bool { // the consumer committed its offsets: nothing is pending
		rep, err := b.auditor.Replica(ctx)
		require.NoError(t, err)
		return rep.Pending == 0
	}, 30*time.Second, 100*time.Millisecond)

	fresh := catalogtest.PurchaseEvent(event.StatusActive, 1, 5, catalogtest.Target(event.TargetPropertyObject, b.objects[0]))
	var once sync.Once
	b.auditor.SetAfterEnds(func(context.Context) error {
		once.Do(func() {
			ev.Status, ev.Version = event.StatusExpired, 2
			b.Produce(t, ev)
			b.Produce(t, fresh)
			require.Eventually(t, func() bool {
				return replicaVersion(t, b, ev.PurchaseId) == 2 && replicaVersion(t, b, fresh.PurchaseId) == 1
			}, 30*time.Second, 10*time.Millisecond, "the live consumer applied both")
		})
		return nil
	})

	rep, err := b.auditor.Replica(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.Drifted, "records applied after the ends were read are not drift: %v", rep.Samples)
	require.GreaterOrEqual(t, rep.Pending, int64(2), "the replica ran ahead of the topic read: pending")

	var bumped uuid.UUID
	require.NoError(t, b.DB.Get(&bumped, `UPDATE catalog.promotion_contributions SET version = 99
		WHERE purchase_id = $1 RETURNING purchase_id`, fresh.PurchaseId))
	require.Eventually(t, func() bool {
		rep, err = b.auditor.Replica(ctx)
		require.NoError(t, err)
		return rep.Drifted == 1
	}, 30*time.Second, 100*time.Millisecond, "a version no record on the topic has is drift: %+v", rep)
	require.Equal(t, bumped, rep.Samples[0].PurchaseId)
}

// replicaVersion is a purchase's newest contribution version, 0 without one.
func replicaVersion(t *testing.T, b *bundle, id uuid.UUID) int64 {
	t.Helper()
	var v int64
	require.NoError(t, b.DB.Get(&v, `SELECT coalesce(max(version), 0) FROM catalog.promotion_contributions WHERE purchase_id = $1`, id))
	return v
}
