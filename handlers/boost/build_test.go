package boost_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// testBuild is a Build and what was staged into it.
type testBuild struct {
	boost.Build
	staged boost.Staged
}

// built is a Build of evs (the records of one partition, in order), in two
// slices, loaded and analysed: ready for its switch.
func (b bundle) built(t *testing.T, evs ...event.PurchaseChanged) *testBuild {
	t.Helper()
	ctx := context.Background()
	build := &testBuild{Build: boost.NewBuild(uuid.New()).Sliced(2)}
	require.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error { return build.CreateTx(ctx, tx) }))
	var err error
	build.staged.Events, err = build.SealEvents(ctx, b.db, b.stage(t, build.Events, evs...))
	require.NoError(t, err)
	require.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error { return build.CreateReplicaTx(ctx, tx) }))
	for k := range build.Events.Slices() {
		require.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error {
			loaded, err := build.LoadSliceTx(ctx, tx, k, build.staged)
			build.staged.Sums += loaded.Targets
			return err
		}))
	}
	require.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error { return build.AnalyzeTx(ctx, tx, build.staged) }))
	return build
}

// stage copies evs into table as records keyed by their PurchaseId, and
// returns how many rows it copied.
func (b bundle) stage(t *testing.T, table boost.EventTable, evs ...event.PurchaseChanged) int64 {
	t.Helper()
	l, err := table.NewLoader(context.Background(), boost.LoaderConfig{DB: b.db,
		Skipped: func(_ int32, _ int64, violation error) { t.Errorf("skipped: %v", violation) }})
	require.NoError(t, err)
	for i, ev := range evs {
		payload, err := json.Marshal(ev)
		require.NoError(t, err)
		require.NoError(t, l.Add(0, int64(i), []byte(ev.PurchaseId.String()), payload))
	}
	require.NoError(t, l.Close())
	return l.Rows()
}

// stageTail copies evs into the build's tail.
func (tb *testBuild) stageTail(t *testing.T, b bundle, evs ...event.PurchaseChanged) {
	t.Helper()
	tb.staged.Tail += b.stage(t, tb.Tail, evs...)
}

// switchTo is the switch's transaction: the writers held back, the tail
// folded in, the build made live.
func switchTo(build *testBuild, cards *int) step {
	return func(ctx context.Context, tx *sqlx.Tx) error {
		if err := boost.LockProjectionTx(ctx, tx); err != nil {
			return err
		}
		if _, err := build.FoldTx(ctx, tx, build.staged); err != nil {
			return err
		}
		n, err := build.SwitchTx(ctx, tx)
		if cards != nil {
			*cards = n
		}
		return err
	}
}

// TestBuild_SwitchReplacesTheReplicaAndWritesOnlyChangedBoosts: a build of
// other events than the live projection's, with a catch-up tail that holds
// a newer and a stale snapshot, replaces the replica (indexes and names as
// the migrations made them), gives every card the formula's boost over it,
// writes only the cards whose boost changes and nothing but the boost, and
// leaves the dedup marks alone.
func TestBuild_SwitchReplacesTheReplicaAndWritesOnlyChangedBoosts(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	p, q, idle := b.newProject(t), b.newProject(t), b.newProject(t)
	o1, o2 := b.newObject(t, p, true), b.newObject(t, p, false)
	evA := changed(uuid.New(), event.StatusActive, 40, 1, onProject(p))
	evB := changed(uuid.New(), event.StatusActive, 5, 2, onObject(o1))
	b.apply(t, evA)
	b.apply(t, evB)
	_, err := b.db.Exec(`INSERT INTO catalog.processed_messages (key) VALUES ('catalog-promotion:purchase-changed:' || gen_random_uuid())`)
	require.NoError(t, err)
	marks := b.count(t, `SELECT count(*) FROM catalog.processed_messages`)
	beforeP, err := boost.GetProjectCard(ctx, b.db, p)
	require.NoError(t, err)
	idleXmin := b.xmin(t, "catalog.project_cards", idle)

	expired := evA
	expired.Status, expired.Version = event.StatusExpired, 2
	evC := changed(uuid.New(), event.StatusActive, 7, 1, onProject(q))
	evD := changed(uuid.New(), event.StatusActive, 3, 1, onObject(o2))
	build := b.built(t, evA, expired, evB, evC, evD)
	newerC, staleB := evC, evB
	newerC.BoostWeight, newerC.Version = 9, 2
	staleB.BoostWeight, staleB.Version = 50, 1
	build.stageTail(t, b, newerC, staleB)

	var cards int
	require.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error { return switchTo(build, &cards)(ctx, tx) }))

	require.Equal(t, 0, b.projectBoost(t, p), "the build's Expired v2 took the project's boost away")
	require.Equal(t, 9, b.projectBoost(t, q), "the tail's newer snapshot")
	require.Equal(t, 5, b.objectBoost(t, o1), "the tail's stale snapshot changed nothing")
	require.Equal(t, 3, b.objectBoost(t, o2), "an unpublished object keeps its own contributions")
	require.Equal(t, 4, cards, "p, q, o1 and o2 changed")
	require.Equal(t, idleXmin, b.xmin(t, "catalog.project_cards", idle), "a card whose boost stays is not written")
	afterP, err := boost.GetProjectCard(ctx, b.db, p)
	require.NoError(t, err)
	beforeP.PromotionBoost, beforeP.UpdatedAt = 0, afterP.UpdatedAt
	require.Equal(t, beforeP, afterP, "card data other than the boost is kept (INV-1)")
	c, ok := b.contribution(t, evA.PurchaseId, onProject(p))
	require.True(t, ok)
	require.Equal(t, int64(2), c.Version)
	require.False(t, c.Active)
	require.Equal(t, 4, b.count(t, `SELECT count(*) FROM catalog.promotion_contributions`))
	require.Equal(t, marks, b.count(t, `SELECT count(*) FROM catalog.processed_messages`), "dedup marks are the consumer's")
	var indexes []string
	require.NoError(t, b.db.Select(&indexes, `SELECT indexrelid::regclass::text FROM pg_index
		WHERE indrelid = 'catalog.promotion_contributions'::regclass ORDER BY 1`))
	require.Equal(t, []string{"catalog.promotion_contributions_pkey", "catalog.promotion_contributions_target_idx"}, indexes)
	b.requireNoDrift(t)

	// The live replica takes events as before.
	b.apply(t, changed(uuid.New(), event.StatusActive, 11, 1, onProject(p)))
	require.Equal(t, 11, b.objectBoost(t, o1)-5)
	b.requireNoDrift(t)
	require.NoError(t, build.Drop(ctx, b.db))
	require.Zero(t, b.count(t, `SELECT count(*) FROM pg_class WHERE relname LIKE 'rebuild\_%'`))
}

// TestBuild_SwitchRacingCardUpsertLeavesNoDrift: a chessboard card upsert and
// the switch, in either order, each waiting for the other's commit: the card
// ends with the boost of the new replica.
func TestBuild_SwitchRacingCardUpsertLeavesNoDrift(t *testing.T) {
	for name, switchFirst := range map[string]bool{"switch first": true, "upsert first": false} {
		t.Run(name, func(t *testing.T) {
			b := setup(t)
			project := b.newProject(t)
			object := b.newObject(t, project, false)
			b.apply(t, changed(uuid.New(), event.StatusActive, 40, 1, onProject(project)))
			build := b.built(t, changed(uuid.New(), event.StatusActive, 8, 1, onProject(project)))
			publish := func(ctx context.Context, tx *sqlx.Tx) error {
				return boost.UpsertPropertyObjectCardTx(ctx, tx, objectCard(object, project, true))
			}
			if switchFirst {
				interleave(t, b, switchTo(build, nil), publish)
			} else {
				interleave(t, b, publish, switchTo(build, nil))
			}

			require.Equal(t, 8, b.objectBoost(t, object), "the published object has the new replica's project boost")
			b.requireNoDrift(t)
		})
	}
}

// TestBuild_PreparedStatementsAreReplannedAfterTheSwitch: the consumer
// prepares its statements once per connection; after the switch dropped the
// table they were planned on, the same connection's statements run on the
// new replica.
func TestBuild_PreparedStatementsAreReplannedAfterTheSwitch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.DatabaseURL(t)
	b := bundle{db: pgtest.Open(t, url)}
	consumer := pgtest.Open(t, url)
	consumer.SetMaxOpenConns(1)
	applier, err := boost.Prepare(ctx, consumer)
	require.NoError(t, err)
	t.Cleanup(func() { _ = applier.Close() })
	apply := func(ev event.PurchaseChanged) (pid int) {
		require.NoError(t, inTx(ctx, consumer, func(tx *sqlx.Tx) error {
			if _, err := applier.Apply(ctx, tx, ev); err != nil {
				return err
			}
			return tx.Get(&pid, `SELECT pg_backend_pid()`)
		}))
		return pid
	}
	project := b.newProject(t)
	before := apply(changed(uuid.New(), event.StatusActive, 40, 1, onProject(project)))

	build := b.built(t, changed(uuid.New(), event.StatusActive, 8, 1, onProject(project)))
	require.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error { return switchTo(build, nil)(ctx, tx) }))
	require.Equal(t, 8, b.projectBoost(t, project))

	after := apply(changed(uuid.New(), event.StatusActive, 5, 1, onProject(project)))
	require.Equal(t, before, after, "one connection, whose statements were prepared before the switch")
	require.Equal(t, 13, b.projectBoost(t, project))
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM catalog.promotion_contributions`))
	b.requireNoDrift(t)
}
