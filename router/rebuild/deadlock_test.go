package rebuild_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestRebuild_ResetDoesNotDeadlockWithALiveBatch forces, with lock waits
// seen in pg_stat_activity, the interleaving in which a whole-projection
// writer (the rebuild's switch, which resets the live projection to the
// built one, and RecomputeAllTx) starts while a live batch
// holds the card tables and has not yet touched the contributions: the batch
// goes on to its apply, and both commit.
func TestRebuild_ResetDoesNotDeadlockWithALiveBatch(t *testing.T) {
	t.Parallel()
	t.Run("rebuild switch", func(t *testing.T) {
		b := catalogtest.New(t, true)
		b.Start(t)
		rb := newRebuilder(t, b)
		raceWithALiveBatch(t, b, func(ctx context.Context) error {
			_, err := rb.Run(ctx)
			return err
		})
		// The batch's event is not on the topic: the switch, after the
		// batch committed, replaced the replica with the topic's (empty).
		require.Zero(t, contributions(t, b), "the switch ran after the batch committed")
		drift, err := boost.Drift(t.Context(), b.DB)
		require.NoError(t, err)
		require.Empty(t, drift)
	})
	t.Run("recompute all", func(t *testing.T) {
		b := catalogtest.New(t, true)
		raceWithALiveBatch(t, b, func(ctx context.Context) error {
			tx, err := b.DB.BeginTxx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback() //nolint:errcheck // no-op after commit
			if _, err := boost.RecomputeAllTx(ctx, tx); err != nil {
				return err
			}
			return tx.Commit()
		})
		drift, err := boost.Drift(t.Context(), b.DB)
		require.NoError(t, err)
		require.Empty(t, drift)
	})
}

// raceWithALiveBatch runs a live batch on a project and one of its published
// objects, held inside its card-lock statement by a third session's lock on
// the object's row, so that it holds both card tables; then starts writer and
// waits until writer waits for the batch; then lets the batch go on to its
// apply. Both must commit.
func raceWithALiveBatch(t *testing.T, b *catalogtest.Bundle, writer func(context.Context) error) {
	t.Helper()
	ctx := t.Context()
	project, object := uuid.New(), uuid.New()
	b.ProjectCard(t, project)
	b.ObjectCard(t, object, project, true)
	applier, err := boost.Prepare(ctx, b.DB)
	require.NoError(t, err)
	t.Cleanup(func() { _ = applier.Close() })

	holder := b.DB.MustBeginTx(ctx, nil)
	defer holder.Rollback() //nolint:errcheck // rolled back below; a no-op then
	holderPid := pgtest.BackendPid(t, holder)
	holder.MustExec(`SELECT 1 FROM catalog.property_object_cards WHERE id = $1 FOR NO KEY UPDATE`, object)

	batchPid := make(chan int, 1)
	batchDone := make(chan error, 1)
	go func() {
		batchDone <- func() error {
			tx, err := b.DB.BeginTxx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback() //nolint:errcheck // no-op after commit
			var pid int
			if err := tx.Get(&pid, `SELECT pg_backend_pid()`); err != nil {
				return err
			}
			batchPid <- pid
			ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetProject, project))
			outs, err := applier.ApplyBatch(ctx, tx, []event.PurchaseChanged{ev})
			if err != nil {
				return err
			}
			if outs[0].CardsRecomputed != 2 {
				t.Errorf("the batch recomputed %d cards, want the project and its object", outs[0].CardsRecomputed)
			}
			return tx.Commit()
		}()
	}()
	pid := <-batchPid
	require.Equal(t, pid, pgtest.WaitBlockedBy(t, b.DB, holderPid), "the batch waits inside its card locks")

	writerDone := make(chan error, 1)
	go func() { writerDone <- writer(context.WithoutCancel(ctx)) }()
	pgtest.WaitBlockedBy(t, b.DB, pid) // the writer waits for the batch's card tables

	require.NoError(t, holder.Rollback())
	for name, done := range map[string]chan error{"live batch": batchDone, "writer": writerDone} {
		select {
		case err := <-done:
			var pqErr *pq.Error
			if err != nil && errors.As(err, &pqErr) {
				t.Errorf("%s failed with SQLSTATE %s (%s): %v", name, pqErr.Code, pqErr.Code.Name(), err)
			} else {
				require.NoError(t, err, name)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s did not end", name)
		}
	}
}
