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

// These tests pin the interleavings that lose a contribution without the
// advisory locks: the second writer must wait for the first one's commit and
// then read its rows.

// step is one transaction's work in an interleaving.
type step func(context.Context, *sqlx.Tx) error

// interleave runs first in a transaction, starts second in another, waits
// until second is blocked on first's locks, then commits first and second.
func interleave(t *testing.T, b bundle, runFirst, runSecond step) {
	t.Helper()
	ctx := context.Background()
	first, err := b.db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer first.Rollback() //nolint:errcheck
	require.NoError(t, runFirst(ctx, first))

	second, err := b.db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer second.Rollback() //nolint:errcheck
	pid := backendPID(t, second)
	done := make(chan error, 1)
	go func() {
		err := runSecond(ctx, second)
		if err == nil {
			err = second.Commit()
		}
		done <- err
	}()

	b.waitBlocked(t, pid)
	require.NoError(t, first.Commit())
	require.NoError(t, <-done)
}

func projectEvent(project uuid.UUID, weight int) step {
	return func(ctx context.Context, tx *sqlx.Tx) error {
		_, err := boost.Apply(ctx, tx, changed(uuid.New(), event.StatusActive, weight, 1, onProject(project)))
		return err
	}
}

func TestApply_TwoEventsOnOneCardSerialiseAndBothCount(t *testing.T) {
	b := setup(t)
	project := b.newProject(t)
	object := b.newObject(t, project, true)

	interleave(t, b, projectEvent(project, 10), func(ctx context.Context, tx *sqlx.Tx) error {
		_, err := boost.Apply(ctx, tx, changed(uuid.New(), event.StatusActive, 20, 1, onObject(object)))
		return err
	})

	require.Equal(t, 10, b.projectBoost(t, project))
	require.Equal(t, 30, b.objectBoost(t, object), "the object event counts the project event committed while it waited")
}

func TestApply_CardUpsertRacingProjectEventGetsTheBoost(t *testing.T) {
	cardUpsert := func(project, object uuid.UUID) step {
		return func(ctx context.Context, tx *sqlx.Tx) error {
			return boost.UpsertPropertyObjectCardTx(ctx, tx, objectCard(object, project, true))
		}
	}
	cases := map[string]func(project, object uuid.UUID) (first, second step){
		"event first": func(p, o uuid.UUID) (step, step) { return projectEvent(p, 10), cardUpsert(p, o) },
		"card first":  func(p, o uuid.UUID) (step, step) { return cardUpsert(p, o), projectEvent(p, 10) },
	}
	for name, order := range cases {
		t.Run(name, func(t *testing.T) {
			b := setup(t)
			project, object := b.newProject(t), uuid.New()
			runFirst, runSecond := order(project, object)
			interleave(t, b, runFirst, runSecond)

			require.Equal(t, 10, b.projectBoost(t, project))
			require.Equal(t, 10, b.objectBoost(t, object), "the new published object gets its project's boost")
		})
	}
}

func TestResetTx_RacingCardUpsertLeavesNoBoostBehind(t *testing.T) {
	reset := func(ctx context.Context, tx *sqlx.Tx) error { return boost.ResetTx(ctx, tx) }
	for _, resetFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("reset first %t", resetFirst), func(t *testing.T) {
			b := setup(t)
			project := b.newProject(t)
			object := b.newObject(t, project, true)
			b.apply(t, changed(uuid.New(), event.StatusActive, 40, 1, onProject(project)))
			upsert := func(ctx context.Context, tx *sqlx.Tx) error {
				return boost.UpsertPropertyObjectCardTx(ctx, tx, objectCard(object, project, true))
			}
			if resetFirst {
				interleave(t, b, reset, upsert)
			} else {
				interleave(t, b, upsert, reset)
			}

			require.Zero(t, b.objectBoost(t, object), "a rebuild's replay starts from zero")
			b.requireNoDrift(t)
		})
	}
}
