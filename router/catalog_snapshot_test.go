package router_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/audit"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/rebuild"
)

// TestCatalog_DroppedTargetLosesItsBoost: every event is the purchase's full
// state, so a version that names fewer targets takes the purchase's
// contribution, and its cascade, off the targets it no longer names: live, in
// a rebuild of the same topic, and in the audit's view alike.
func TestCatalog_DroppedTargetLosesItsBoost(t *testing.T) {
	b := setupCatalog(t, true)
	kept, droppedProject, droppedObject := uuid.New(), uuid.New(), uuid.New()
	keptObject, cascaded := uuid.New(), uuid.New()
	b.ProjectCard(t, kept)
	b.ObjectCard(t, keptObject, kept, true)
	b.ProjectCard(t, droppedProject)
	b.ObjectCard(t, cascaded, droppedProject, true)
	b.ProjectCard(t, uuid.New())
	b.ObjectCard(t, droppedObject, uuid.New(), true)
	b.Start(t)

	v1 := catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetProject, kept),
		catalogtest.Target(event.TargetProject, droppedProject), catalogtest.Target(event.TargetPropertyObject, droppedObject))
	other := catalogtest.PurchaseEvent(event.StatusActive, 1, 3, catalogtest.Target(event.TargetProject, droppedProject))
	b.Produce(t, v1)
	b.Produce(t, other)
	b.WaitBoost(t, event.TargetPropertyObject, cascaded, 13)
	b.WaitBoost(t, event.TargetPropertyObject, droppedObject, 10)

	v2 := v1
	v2.Version, v2.Targets = 2, v1.Targets[:1]
	b.Produce(t, v2)
	b.WaitBoost(t, event.TargetPropertyObject, cascaded, 3)
	require.Equal(t, 3, b.BoostOf(event.TargetProject, droppedProject), "the dropped project keeps only the other purchase's weight")
	require.Zero(t, b.BoostOf(event.TargetPropertyObject, droppedObject), "the dropped object loses the purchase's weight")
	require.Equal(t, 10, b.BoostOf(event.TargetProject, kept))
	require.Equal(t, 10, b.BoostOf(event.TargetPropertyObject, keptObject), "the kept project still cascades")
	var rows int
	require.NoError(t, b.DB.Get(&rows, `SELECT count(*) FROM catalog.promotion_contributions WHERE purchase_id = $1`, v1.PurchaseId))
	require.Equal(t, 1, rows, "the replica holds the latest version's targets only")

	live := b.CardBoosts(t)
	runRebuild(t, b)
	require.Equal(t, live, b.CardBoosts(t), "a rebuild of the same topic gives the live cards")

	a, err := audit.New(audit.Config{DB: b.DB, Kafka: b.Cfg.Kafka, Topic: b.Cfg.Topic, ConsumerGroup: b.Cfg.ConsumerGroup,
		Log: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	cards, err := a.Cards(context.Background())
	require.NoError(t, err)
	require.Zero(t, cards.Drifted, "%v", cards.Samples)
	rep, err := a.Replica(context.Background())
	require.NoError(t, err)
	require.Equal(t, audit.ReplicaReport{Purchases: 2}, rep)

	// A contribution left on a dropped target is what the audit must catch.
	_, err = b.DB.Exec(`INSERT INTO catalog.promotion_contributions
			(purchase_id, target_kind, target_id, boost_weight, status, version, active, ends_at, updated_at)
		SELECT purchase_id, 'PropertyObject', $2, boost_weight, status, version, active, ends_at, updated_at
		FROM catalog.promotion_contributions WHERE purchase_id = $1`, v1.PurchaseId, droppedObject)
	require.NoError(t, err)
	rep, err = a.Replica(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, rep.Drifted, "%v", rep.Samples)
	require.Equal(t, v1.PurchaseId, rep.Samples[0].PurchaseId)
	cards, err = a.Cards(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, cards.Drifted, "the object's boost lacks the tampered contribution: %v", cards.Samples)
}

// runRebuild rebuilds b's projection from its topic, to the end.
func runRebuild(t *testing.T, b *catalogtest.Bundle) rebuild.Status {
	t.Helper()
	rb, err := rebuild.New(rebuild.Config{DB: b.DB, Kafka: b.Cfg.Kafka, Topic: b.Cfg.Topic, Log: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(rb.Stop)
	st, err := rb.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, rebuild.StateDone, st.State)
	return st
}
