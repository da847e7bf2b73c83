package boost_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
)

// TestApply_CardUpsertRacingADroppedProjectLeavesNoBoost: a version that drops
// a project target takes the purchase's weight off the project's objects,
// among them one that a card upsert adds meanwhile: the event waits for the
// upsert's lock on the dropped project (or the upsert for the event's), so
// that neither misses the other's rows.
func TestApply_CardUpsertRacingADroppedProjectLeavesNoBoost(t *testing.T) {
	for _, eventFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "event first", false: "card first"}[eventFirst], func(t *testing.T) {
			b := setup(t)
			dropped, kept := b.newProject(t), b.newProject(t)
			purchase, object := uuid.New(), uuid.New()
			b.apply(t, changed(purchase, event.StatusActive, 10, 1, onProject(dropped), onProject(kept)))
			drop := func(ctx context.Context, tx *sqlx.Tx) error {
				_, err := boost.Apply(ctx, tx, changed(purchase, event.StatusActive, 10, 2, onProject(kept)))
				return err
			}
			upsert := func(ctx context.Context, tx *sqlx.Tx) error {
				return boost.UpsertPropertyObjectCardTx(ctx, tx, objectCard(object, dropped, true))
			}
			if eventFirst {
				interleave(t, b, drop, upsert)
			} else {
				interleave(t, b, upsert, drop)
			}

			require.Zero(t, b.projectBoost(t, dropped))
			require.Zero(t, b.objectBoost(t, object), "the new object of the dropped project gets none of its weight")
			require.Equal(t, 10, b.projectBoost(t, kept))
			b.requireNoDrift(t)
		})
	}
}

// TestBuild_CatchUpDropsTheTargetsANewerVersionNoLongerNames: a rebuild's
// catch-up folds a newer version into the new replica as the consumer
// applies it: the targets it no longer names lose their contributions and
// their sums, and the switch gives the cards the boosts the live consumer
// gives them.
func TestBuild_CatchUpDropsTheTargetsANewerVersionNoLongerNames(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	kept, dropped := b.newProject(t), b.newProject(t)
	object := b.newObject(t, dropped, true)
	v1 := changed(uuid.New(), event.StatusActive, 10, 1, onProject(kept), onProject(dropped))
	v2 := changed(v1.PurchaseId, event.StatusActive, 10, 2, onProject(kept))
	b.apply(t, v1)
	b.apply(t, v2)
	live := b.boosts(t)

	build := b.built(t, v1)
	build.stageTail(t, b, v2)
	require.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error { return switchTo(build, nil)(ctx, tx) }))

	require.Equal(t, live, b.boosts(t), "the switch gives the cards the live boosts")
	require.Zero(t, b.objectBoost(t, object), "the dropped project's object")
	_, ok := b.contribution(t, v1.PurchaseId, onProject(dropped))
	require.False(t, ok, "the new replica holds no contribution on the dropped target")
	b.requireNoDrift(t)
}
