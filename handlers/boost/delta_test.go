package boost_test

import (
	"context"
	"flag"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
)

var seedFlag = flag.Uint64("boost.seed", 0, "seed of TestConsumer_DeltaEqualsRecompute; 0 picks a new one")

// deltaWorld is the state of TestConsumer_DeltaEqualsRecompute as the test
// expects it: the cards chessboard has sent and every snapshot of every
// purchase sent so far.
type deltaWorld struct {
	rng      *rand.Rand
	projects []uuid.UUID // every project id, with or without a card
	objects  []uuid.UUID // every object id, with or without a card
	targets  []event.Target
	// projectCards and objectCards are the cards that exist.
	projectCards []uuid.UUID
	objectCards  map[uuid.UUID]boost.PropertyObjectCard
	// sent is every snapshot of a purchase, in version order; applied is the
	// latest one applied.
	sent      map[uuid.UUID][]event.PurchaseChanged
	purchases []uuid.UUID
	applied   map[uuid.UUID]event.PurchaseChanged
}

func (w *deltaWorld) pick(n int) int { return w.rng.IntN(n) }

// newPurchase is a purchase's first snapshot over 1..3 random targets.
func (w *deltaWorld) newPurchase() event.PurchaseChanged {
	var tg []event.Target
	for range 1 + w.pick(3) {
		tg = append(tg, w.targets[w.pick(len(w.targets))])
	}
	status := event.StatusActive
	if w.pick(4) == 0 {
		status = event.StatusPending
	}
	return changed(uuid.New(), status, 1+w.pick(100), 1, tg...)
}

// next is the next snapshot of a live purchase: Pending → Active, Active →
// Expired, Cancelled or Active again (another payment status, sometimes
// another weight). ok is false for a terminal purchase.
func (w *deltaWorld) next(last event.PurchaseChanged) (ev event.PurchaseChanged, ok bool) {
	ev = last
	ev.Version++
	switch {
	case last.Status.Terminal():
		return ev, false
	case last.Status == event.StatusPending:
		ev.Status = event.StatusActive
	default:
		switch w.pick(4) {
		case 0:
			ev.Status = event.StatusExpired
		case 1:
			ev.Status = event.StatusCancelled
		case 2:
			ev.BoostWeight = 1 + w.pick(100)
		}
	}
	return ev, true
}

// TestConsumer_DeltaEqualsRecompute applies random sequences of activations,
// expiries, cancels, stale and duplicate snapshots and card writes (late
// cards, publish, unpublish, moves between projects) and checks after each
// step that every card equals both a full recompute from the replica and the
// seed's formula over what was sent.
func TestConsumer_DeltaEqualsRecompute(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun: go test ./handlers/boost -run TestConsumer_DeltaEqualsRecompute -boost.seed=%d)", seed, seed)

	w := &deltaWorld{
		rng:         rand.New(rand.NewPCG(seed, 0)),
		objectCards: map[uuid.UUID]boost.PropertyObjectCard{},
		sent:        map[uuid.UUID][]event.PurchaseChanged{},
		applied:     map[uuid.UUID]event.PurchaseChanged{},
	}
	// Three projects and eight objects; the last project and two objects
	// have no card at first, and a project and an object never get one.
	for i := range 4 {
		w.projects = append(w.projects, uuid.New())
		if i < 2 {
			w.projectCards = append(w.projectCards, w.projects[i])
			b.upsertProject(t, projectCard(w.projects[i]))
		}
	}
	for i := range 9 {
		w.objects = append(w.objects, uuid.New())
		if i < 6 {
			c := objectCard(w.objects[i], w.projects[w.pick(3)], w.pick(3) > 0)
			w.objectCards[c.ID] = c
			b.upsertObject(t, c)
		}
	}
	for _, p := range w.projects {
		w.targets = append(w.targets, onProject(p))
	}
	for _, o := range w.objects {
		w.targets = append(w.targets, onObject(o))
	}
	w.targets = append(w.targets, onPost(uuid.New()))

	send := func(ev event.PurchaseChanged) boost.Outcome {
		out := b.apply(t, ev)
		if last, ok := w.applied[ev.PurchaseId]; !ok || ev.Version >= last.Version {
			w.applied[ev.PurchaseId] = ev
		}
		return out
	}
	for step := range 400 {
		var what string
		switch r := w.pick(100); {
		case r < 25 || len(w.purchases) == 0:
			ev := w.newPurchase()
			what = "new purchase " + string(ev.Status)
			w.purchases = append(w.purchases, ev.PurchaseId)
			w.sent[ev.PurchaseId] = []event.PurchaseChanged{ev}
			send(ev)
		case r < 50:
			id := w.purchases[w.pick(len(w.purchases))]
			hist := w.sent[id]
			ev, ok := w.next(hist[len(hist)-1])
			if !ok {
				continue
			}
			what = "transition to " + string(ev.Status)
			w.sent[id] = append(hist, ev)
			send(ev)
		case r < 60:
			hist := w.sent[w.purchases[w.pick(len(w.purchases))]]
			if len(hist) < 2 {
				continue
			}
			what = "stale snapshot"
			out := send(hist[w.pick(len(hist)-1)])
			require.True(t, out.Stale || out.PostOnly, "step %d: %s: %+v", step, what, out)
		case r < 70:
			hist := w.sent[w.purchases[w.pick(len(w.purchases))]]
			what = "duplicate snapshot"
			out := send(hist[len(hist)-1])
			require.Zero(t, out.CardsRecomputed, "step %d: %s", step, what)
		case r < 78:
			id := w.projects[w.pick(3)]
			what = "project card upsert"
			b.upsertProject(t, projectCard(id))
			if !slices.Contains(w.projectCards, id) {
				w.projectCards = append(w.projectCards, id)
			}
		default:
			// Moves among the three projects and to one without a card.
			c := objectCard(w.objects[w.pick(8)], w.projects[w.pick(4)], w.pick(3) > 0)
			what = "object card upsert"
			b.upsertObject(t, c)
			w.objectCards[c.ID] = c
		}
		require.Equal(t, wantBoosts(w.applied, w.projectCards, w.objectCards), b.boosts(t), "step %d: %s", step, what)
		b.requireNoDrift(t, "step %d: %s", step, what)
	}

	var repaired int
	require.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error {
		var err error
		repaired, err = boost.RecomputeAllTx(ctx, tx)
		return err
	}))
	require.Zero(t, repaired, "the deltas left nothing to repair")
}

// TestConsumer_ProjectWithFortyThousandObjectsOnDefaultLockTable: a Project
// purchase reaches every published object of a 40,000-object project with
// two advisory locks (purchase, project), well within PostgreSQL's default
// lock table, where one lock per object failed with 53200.
func TestConsumer_ProjectWithFortyThousandObjectsOnDefaultLockTable(t *testing.T) {
	b := setupAlone(t) // not parallel: it fills a lock table of the default size alone
	ctx := context.Background()
	const objects, weight = 40_000, 7

	// The condition under test: a lock table no larger than the default
	// 64 × 100 (scripts/stack.sh: 21 × 300).
	var slots int
	require.NoError(t, b.db.Get(&slots, `SELECT current_setting('max_locks_per_transaction')::integer
		* current_setting('max_connections')::integer`))
	require.LessOrEqual(t, slots, 64*100, "the test database's lock table is larger than PostgreSQL's default")

	project, other := b.newProject(t), b.newProject(t)
	otherObject := b.newObject(t, other, true)
	// Chessboard's bulk load: no contributions yet, so every boost is 0.
	_, err := b.db.Exec(`INSERT INTO catalog.property_object_cards (id, project_id, published, status, price)
		SELECT gen_random_uuid(), $1, g <= $2, 'Free', 5100000 FROM generate_series(1, $2 + 100) AS g`, project, objects)
	require.NoError(t, err)
	_, err = b.db.Exec(`ANALYZE catalog.property_object_cards`)
	require.NoError(t, err)

	boosted := func() int {
		return b.count(t, `SELECT count(*) FROM catalog.property_object_cards
			WHERE project_id = $1 AND published AND promotion_boost = $2`, project, weight)
	}
	purchase := uuid.New()
	var advisoryLocks int
	var took time.Duration
	apply := func(ev event.PurchaseChanged) boost.Outcome {
		var out boost.Outcome
		require.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error {
			start := time.Now()
			var err error
			if out, err = boost.Apply(ctx, tx, ev); err != nil {
				return err
			}
			took = time.Since(start)
			return tx.Get(&advisoryLocks, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`)
		}))
		return out
	}

	out := apply(changed(purchase, event.StatusActive, weight, 1, onProject(project)))
	t.Logf("activation: %d cards in %s", out.CardsRecomputed, took)
	require.Equal(t, objects+1, out.CardsRecomputed, "the project card and every published object")
	require.Equal(t, 2, advisoryLocks, "one purchase lock and one project lock, whatever the project's size")
	require.Equal(t, objects, boosted())
	require.Equal(t, weight, b.projectBoost(t, project))
	require.Zero(t, b.count(t, `SELECT count(*) FROM catalog.property_object_cards WHERE NOT published AND promotion_boost <> 0`))
	require.Zero(t, b.objectBoost(t, otherObject))

	out = apply(changed(purchase, event.StatusExpired, weight, 2, onProject(project)))
	t.Logf("expiry: %d cards in %s", out.CardsRecomputed, took)
	require.Equal(t, objects+1, out.CardsRecomputed)
	require.Zero(t, b.count(t, `SELECT count(*) FROM catalog.property_object_cards WHERE promotion_boost <> 0`))
	require.Zero(t, b.projectBoost(t, project))
	b.requireNoDrift(t)
}
