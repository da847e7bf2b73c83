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

// These tests pin the interleavings that lose a contribution without the
// advisory locks: the second writer must wait for the first one's commit and
// then read its rows.

func TestApply_TwoEventsOnOneCardSerialiseAndBothCount(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	project := b.newProject(t)
	object := b.newObject(t, project, true)

	first, err := b.db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer first.Rollback() //nolint:errcheck
	_, err = boost.Apply(ctx, first, changed(uuid.New(), event.StatusActive, 10, 1, onProject(project)))
	require.NoError(t, err)

	second, err := b.db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer second.Rollback() //nolint:errcheck
	pid := backendPID(t, second)
	done := make(chan error, 1)
	go func() {
		_, err := boost.Apply(ctx, second, changed(uuid.New(), event.StatusActive, 20, 1, onObject(object)))
		if err == nil {
			err = second.Commit()
		}
		done <- err
	}()

	b.waitBlocked(t, pid)
	require.NoError(t, first.Commit())
	require.NoError(t, <-done)

	require.Equal(t, 10, b.projectBoost(t, project))
	require.Equal(t, 30, b.objectBoost(t, object), "the object event counts the project event committed while it waited")
}

func TestApply_CardUpsertRacingProjectEventGetsTheBoost(t *testing.T) {
	projectEvent := func(project uuid.UUID) func(context.Context, *sqlx.Tx) error {
		return func(ctx context.Context, tx *sqlx.Tx) error {
			_, err := boost.Apply(ctx, tx, changed(uuid.New(), event.StatusActive, 10, 1, onProject(project)))
			return err
		}
	}
	cardUpsert := func(project, object uuid.UUID) func(context.Context, *sqlx.Tx) error {
		return func(ctx context.Context, tx *sqlx.Tx) error {
			return boost.UpsertPropertyObjectCardTx(ctx, tx, objectCard(object, project, true))
		}
	}
	cases := map[string]func(project, object uuid.UUID) (first, second func(context.Context, *sqlx.Tx) error){
		"event first": func(p, o uuid.UUID) (f, s func(context.Context, *sqlx.Tx) error) {
			return projectEvent(p), cardUpsert(p, o)
		},
		"card first": func(p, o uuid.UUID) (f, s func(context.Context, *sqlx.Tx) error) {
			return cardUpsert(p, o), projectEvent(p)
		},
	}
	for name, order := range cases {
		t.Run(name, func(t *testing.T) {
			b := setup(t)
			ctx := context.Background()
			project, object := b.newProject(t), uuid.New()
			runFirst, runSecond := order(project, object)

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

			require.Equal(t, 10, b.projectBoost(t, project))
			require.Equal(t, 10, b.objectBoost(t, object), "the new published object gets its project's boost")
		})
	}
}
