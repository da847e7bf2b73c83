package boost_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
)

// These tests pin the interleavings that lose a contribution without the
// locks of lock.go: the second writer must wait for the first one's commit
// and then read its rows.

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

// cardUpsert is the feed's upsert of a new published object of project.
func cardUpsert(project, object uuid.UUID) step {
	return func(ctx context.Context, tx *sqlx.Tx) error {
		return boost.UpsertPropertyObjectCardTx(ctx, tx, objectCard(object, project, true))
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

// raceCardUpsert runs ev on a project and the upsert of a new published
// object of it, in both orders, the second blocked on the first, then check.
func raceCardUpsert(t *testing.T, ev func(project uuid.UUID) step, check func(t *testing.T, b bundle, project, object uuid.UUID)) {
	cases := map[string]func(project, object uuid.UUID) (first, second step){
		"event first": func(p, o uuid.UUID) (step, step) { return ev(p), cardUpsert(p, o) },
		"card first":  func(p, o uuid.UUID) (step, step) { return cardUpsert(p, o), ev(p) },
	}
	for name, order := range cases {
		t.Run(name, func(t *testing.T) {
			b := setup(t)
			project, object := b.newProject(t), uuid.New()
			runFirst, runSecond := order(project, object)
			interleave(t, b, runFirst, runSecond)
			check(t, b, project, object)
		})
	}
}

func TestApply_CardUpsertRacingProjectEventGetsTheBoost(t *testing.T) {
	raceCardUpsert(t, func(p uuid.UUID) step { return projectEvent(p, 10) }, func(t *testing.T, b bundle, project, object uuid.UUID) {
		require.Equal(t, 10, b.projectBoost(t, project))
		require.Equal(t, 10, b.objectBoost(t, object), "the new published object gets its project's boost")
	})
}

// TestApply_CardUpsertRacingWideEventGetsTheBoost: an event of more targets
// than there are lock stripes takes its targets' stripes, not their own
// locks; a card upsert of one of them still waits for it, or it for the
// upsert, so the new card gets the event's boost.
func TestApply_CardUpsertRacingWideEventGetsTheBoost(t *testing.T) {
	wideEvent := func(project uuid.UUID) step {
		targets := []event.Target{onProject(project)}
		for range 40 {
			targets = append(targets, onProject(uuid.New()), onObject(uuid.New()))
		}
		return func(ctx context.Context, tx *sqlx.Tx) error {
			_, err := boost.Apply(ctx, tx, changed(uuid.New(), event.StatusActive, 10, 1, targets...))
			return err
		}
	}
	raceCardUpsert(t, wideEvent, func(t *testing.T, b bundle, _, object uuid.UUID) {
		require.Equal(t, 10, b.objectBoost(t, object), "the new published object gets the wide event's boost")
	})
}

func TestApply_CardLeavingProjectDuringProjectEventKeepsOnlyItsNewBoost(t *testing.T) {
	type leave struct {
		card func(project, other, object uuid.UUID) boost.PropertyObjectCard
		want int
	}
	leaves := map[string]leave{
		"moved":       {func(_, other, o uuid.UUID) boost.PropertyObjectCard { return objectCard(o, other, true) }, 30},
		"unpublished": {func(p, _, o uuid.UUID) boost.PropertyObjectCard { return objectCard(o, p, false) }, 0},
	}
	for name, l := range leaves {
		for _, eventFirst := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s, event first %t", name, eventFirst), func(t *testing.T) {
				b := setup(t)
				project, other := b.newProject(t), b.newProject(t)
				object := b.newObject(t, project, true)
				b.apply(t, changed(uuid.New(), event.StatusActive, 30, 1, onProject(other)))
				upsert := func(ctx context.Context, tx *sqlx.Tx) error {
					return boost.UpsertPropertyObjectCardTx(ctx, tx, l.card(project, other, object))
				}
				if eventFirst {
					interleave(t, b, projectEvent(project, 10), upsert)
				} else {
					interleave(t, b, upsert, projectEvent(project, 10))
				}

				require.Equal(t, 10, b.projectBoost(t, project))
				require.Equal(t, l.want, b.objectBoost(t, object), "the project it left no longer counts")
				b.requireNoDrift(t)
			})
		}
	}
}

func TestApply_ConcurrentEventsOnSharedCardsInAnyOrderDoNotDeadlock(t *testing.T) {
	for name, batch := range map[string]int{"one event a transaction": 1, "batches of eight": 8} {
		t.Run(name, func(t *testing.T) {
			b := setup(t)
			ctx := context.Background()
			const workers, perWorker = 6, 15

			var targets []event.Target
			for range 3 {
				p := b.newProject(t)
				targets = append(targets, onProject(p))
				for range 3 {
					targets = append(targets, onObject(b.newObject(t, p, true)))
				}
			}
			var wg sync.WaitGroup
			start := make(chan struct{})
			for w := range workers {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					<-start
					for range perWorker {
						// Events of four targets in a random order: the cards
						// they address overlap every other worker's, in
						// another order.
						var evs []event.PurchaseChanged
						for range batch {
							tg := slices.Clone(targets)
							rng.Shuffle(len(tg), func(i, j int) { tg[i], tg[j] = tg[j], tg[i] })
							evs = append(evs, changed(uuid.New(), event.StatusActive, 1+rng.IntN(100), 1, tg[:4]...))
						}
						err := inTx(ctx, b.db, func(tx *sqlx.Tx) error {
							if _, err := boost.ApplyBatch(ctx, tx, evs); err != nil {
								return err
							}
							_, err := tx.ExecContext(ctx, `SELECT pg_sleep(0.002)`)
							return err
						})
						if !assert.NoError(t, err, "no deadlock, no conflict to retry") {
							return
						}
					}
				})
			}
			close(start)
			wg.Wait()
			require.False(t, t.Failed())
			b.requireNoDrift(t)
		})
	}
}

func TestApply_EventsOfOnePurchaseSerialise(t *testing.T) {
	// A replay racing the live consumer: the same purchase's snapshots in
	// two transactions, the second started before the first commits.
	cases := map[string]struct {
		second event.Status
		want   int
	}{
		"next Active snapshot":     {event.StatusActive, 25},
		"expiry racing activation": {event.StatusExpired, 0},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			b := setup(t)
			project := b.newProject(t)
			object := b.newObject(t, project, true)
			purchase := uuid.New()
			snapshot := func(status event.Status, version int64) step {
				return func(ctx context.Context, tx *sqlx.Tx) error {
					_, err := boost.Apply(ctx, tx, changed(purchase, status, 25, version, onProject(project)))
					return err
				}
			}
			interleave(t, b, snapshot(event.StatusActive, 1), snapshot(c.second, 2))

			require.Equal(t, c.want, b.projectBoost(t, project))
			require.Equal(t, c.want, b.objectBoost(t, object))
			b.requireNoDrift(t)
		})
	}
}

func TestApply_ConcurrentEventsAndCardMovesLeaveNoDrift(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	const workers, perWorker = 4, 30

	var projects, objects []uuid.UUID
	for range 3 {
		projects = append(projects, b.newProject(t))
	}
	for i := range 6 {
		objects = append(objects, b.newObject(t, projects[i%3], true))
	}
	var targets []event.Target
	for _, p := range projects {
		targets = append(targets, onProject(p))
	}
	for _, o := range objects {
		targets = append(targets, onObject(o))
	}

	var wg sync.WaitGroup
	start := make(chan struct{})
	done := make(chan struct{})
	var events sync.WaitGroup
	for w := range workers {
		events.Add(1)
		wg.Go(func() {
			defer events.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			<-start
			for range perWorker {
				tg := slices.Clone(targets)
				rng.Shuffle(len(tg), func(i, j int) { tg[i], tg[j] = tg[j], tg[i] })
				ev := changed(uuid.New(), event.StatusActive, 1+rng.IntN(100), 1, tg[:1+rng.IntN(3)]...)
				evs := []event.PurchaseChanged{ev}
				if rng.IntN(3) == 0 {
					ev.Status, ev.Version = event.StatusExpired, 2
					evs = append(evs, ev)
				}
				for _, ev := range evs {
					if !assert.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error { _, err := boost.Apply(ctx, tx, ev); return err })) {
						return
					}
				}
			}
		})
	}
	// Chessboard moves, publishes and unpublishes objects until the events
	// are done.
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(99, 11))
		<-start
		for {
			select {
			case <-done:
				return
			default:
			}
			c := objectCard(objects[rng.IntN(len(objects))], projects[rng.IntN(len(projects))], rng.IntN(3) > 0)
			if !assert.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error { return boost.UpsertPropertyObjectCardTx(ctx, tx, c) })) {
				return
			}
		}
	})
	close(start)
	events.Wait()
	close(done)
	wg.Wait()
	require.False(t, t.Failed())
	b.requireNoDrift(t)
}
