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
