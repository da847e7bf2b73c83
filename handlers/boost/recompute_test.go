package boost_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
)

func TestRecomputeAllTx_RepairsDriftedCardsAndTheirBoostOnly(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	project := b.newProject(t)
	published := b.newObject(t, project, true)
	draft := b.newObject(t, project, false)
	b.apply(t, changed(uuid.New(), event.StatusActive, 20, 1, onProject(project)))
	b.apply(t, changed(uuid.New(), event.StatusActive, 5, 1, onObject(draft)))
	b.requireNoDrift(t)

	// Drift as a lost or doubled delta would leave it.
	_, err := b.db.Exec(`UPDATE catalog.property_object_cards SET promotion_boost = promotion_boost + 3 WHERE id = ANY($1)`,
		[]string{published.String(), draft.String()})
	require.NoError(t, err)
	_, err = b.db.Exec(`UPDATE catalog.project_cards SET promotion_boost = 0 WHERE id = $1`, project)
	require.NoError(t, err)
	before, err := boost.GetPropertyObjectCard(ctx, b.db, published)
	require.NoError(t, err)

	drift, err := boost.Drift(ctx, b.db)
	require.NoError(t, err)
	want := []boost.CardDrift{
		{Kind: event.TargetProject, ID: project, Stored: 0, Want: 20},
		{Kind: event.TargetPropertyObject, ID: published, Stored: 23, Want: 20},
		{Kind: event.TargetPropertyObject, ID: draft, Stored: 8, Want: 5},
	}
	require.ElementsMatch(t, want, drift)

	recompute := func() int {
		var n int
		require.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error {
			var err error
			n, err = boost.RecomputeAllTx(ctx, tx)
			return err
		}))
		return n
	}
	require.Equal(t, 3, recompute())
	b.requireNoDrift(t)
	require.Equal(t, 20, b.projectBoost(t, project))
	require.Equal(t, 20, b.objectBoost(t, published))
	require.Equal(t, 5, b.objectBoost(t, draft))
	after, err := boost.GetPropertyObjectCard(ctx, b.db, published)
	require.NoError(t, err)
	before.PromotionBoost, before.UpdatedAt = after.PromotionBoost, after.UpdatedAt
	require.Equal(t, before, after, "INV-1: only the boost is written")

	require.Zero(t, recompute(), "nothing left to repair")
}

// TestRepairTx_RacingALiveEventLeavesNoDrift: a repair of drifted cards takes
// the locks a card upsert takes, so an event on the same project, before or
// after it, keeps its delta.
func TestRepairTx_RacingALiveEventLeavesNoDrift(t *testing.T) {
	for _, repairFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("repair first %t", repairFirst), func(t *testing.T) {
			b := setup(t)
			project := b.newProject(t)
			object := b.newObject(t, project, true)
			b.apply(t, changed(uuid.New(), event.StatusActive, 20, 1, onProject(project)))
			_, err := b.db.Exec(`UPDATE catalog.property_object_cards SET promotion_boost = 99 WHERE id = $1`, object)
			require.NoError(t, err)
			drift, err := boost.Drift(context.Background(), b.db)
			require.NoError(t, err)
			require.Len(t, drift, 1)

			repair := func(ctx context.Context, tx *sqlx.Tx) error {
				n, err := boost.RepairTx(ctx, tx, drift)
				if err == nil && n != 1 {
					err = fmt.Errorf("repaired %d cards, want 1", n)
				}
				return err
			}
			if repairFirst {
				interleave(t, b, repair, projectEvent(project, 7))
			} else {
				interleave(t, b, projectEvent(project, 7), repair)
			}

			require.Equal(t, 27, b.objectBoost(t, object))
			require.Equal(t, 27, b.projectBoost(t, project))
			b.requireNoDrift(t)
		})
	}
}
