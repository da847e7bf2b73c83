package boost_test

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
)

func TestApply_ActivationOnPropertyObjectIncludesProjectCascade(t *testing.T) {
	b := setup(t)
	project := b.newProject(t)
	object := b.newObject(t, project, true)
	b.apply(t, changed(uuid.New(), event.StatusActive, 30, 1, onProject(project)))

	purchase := uuid.New()
	out := b.apply(t, changed(purchase, event.StatusActive, 50, 1, onObject(object)))

	require.Equal(t, boost.Outcome{Contributions: 1, CardsRecomputed: 1}, out)
	c, ok := b.contribution(t, purchase, onObject(object))
	require.True(t, ok)
	require.Equal(t, contribution{BoostWeight: 50, Status: event.StatusActive, Version: 1, Active: true}, c)
	require.Equal(t, 80, b.objectBoost(t, object), "own 50 + project cascade 30")
	require.Equal(t, 30, b.projectBoost(t, project), "an object's contribution does not reach its project")
}

func TestApply_ProjectCascadesToPublishedObjectsOnly(t *testing.T) {
	b := setup(t)
	project := b.newProject(t)
	published1 := b.newObject(t, project, true)
	published2 := b.newObject(t, project, true)
	unpublished := b.newObject(t, project, false)
	other := b.newProject(t)
	otherObject := b.newObject(t, other, true)

	out := b.apply(t, changed(uuid.New(), event.StatusActive, 20, 1, onProject(project)))

	require.Equal(t, boost.Outcome{Contributions: 1, CardsRecomputed: 3}, out)
	require.Equal(t, 20, b.projectBoost(t, project))
	require.Equal(t, 20, b.objectBoost(t, published1))
	require.Equal(t, 20, b.objectBoost(t, published2))
	require.Equal(t, 0, b.objectBoost(t, unpublished))
	require.Equal(t, 0, b.projectBoost(t, other))
	require.Equal(t, 0, b.objectBoost(t, otherObject))
}

func TestApply_ExpiredOrCancelledRemovesContribution(t *testing.T) {
	for _, status := range []event.Status{event.StatusExpired, event.StatusCancelled} {
		t.Run(string(status), func(t *testing.T) {
			b := setup(t)
			project := b.newProject(t)
			object := b.newObject(t, project, true)
			b.apply(t, changed(uuid.New(), event.StatusActive, 10, 1, onProject(project)))
			purchase := uuid.New()
			b.apply(t, changed(purchase, event.StatusActive, 40, 1, onProject(project), onObject(object)))
			require.Equal(t, 50, b.projectBoost(t, project))
			require.Equal(t, 90, b.objectBoost(t, object))

			out := b.apply(t, changed(purchase, status, 40, 2, onProject(project), onObject(object)))

			require.Equal(t, boost.Outcome{Contributions: 2, CardsRecomputed: 2}, out)
			for _, target := range []event.Target{onProject(project), onObject(object)} {
				c, ok := b.contribution(t, purchase, target)
				require.True(t, ok, "the contribution is kept, inactive")
				require.Equal(t, contribution{BoostWeight: 40, Status: status, Version: 2, Active: false}, c)
			}
			require.Equal(t, 10, b.projectBoost(t, project), "the other purchase still counts")
			require.Equal(t, 10, b.objectBoost(t, object))
		})
	}
}

func TestApply_PendingContributionDoesNotCount(t *testing.T) {
	b := setup(t)
	project := b.newProject(t)
	purchase := uuid.New()

	out := b.apply(t, changed(purchase, event.StatusPending, 40, 1, onProject(project)))

	require.Equal(t, boost.Outcome{Contributions: 1}, out)
	c, ok := b.contribution(t, purchase, onProject(project))
	require.True(t, ok)
	require.False(t, c.Active)
	require.Equal(t, 0, b.projectBoost(t, project))
}

func TestApply_PostOnlyEventIsNoOp(t *testing.T) {
	b := setup(t)
	project := b.newProject(t)
	before := b.xmin(t, "catalog.project_cards", project)

	out := b.apply(t, changed(uuid.New(), event.StatusActive, 70, 1, onPost(uuid.New()), onPost(uuid.New())))

	require.Equal(t, boost.Outcome{PostOnly: true}, out)
	require.Zero(t, b.count(t, `SELECT count(*) FROM catalog.promotion_contributions`))
	require.Equal(t, before, b.xmin(t, "catalog.project_cards", project))
}

func TestApply_PostTargetsBesideCardTargetsAreIgnored(t *testing.T) {
	b := setup(t)
	project := b.newProject(t)
	post := uuid.New()

	out := b.apply(t, changed(uuid.New(), event.StatusActive, 15, 1, onPost(post), onProject(project)))

	require.Equal(t, boost.Outcome{Contributions: 1, CardsRecomputed: 1}, out)
	require.Zero(t, b.count(t, `SELECT count(*) FROM catalog.promotion_contributions WHERE target_id = $1`, post))
	require.Equal(t, 15, b.projectBoost(t, project))
}

func TestApply_MissingCardKeepsContributionAndLateCardGetsBoost(t *testing.T) {
	b := setup(t)
	project, object, unpublished := uuid.New(), uuid.New(), uuid.New()
	projectPurchase, objectPurchase := uuid.New(), uuid.New()

	out := b.apply(t, changed(projectPurchase, event.StatusActive, 20, 1, onProject(project)))
	require.Equal(t, boost.Outcome{Contributions: 1}, out, "no card, no error")
	out = b.apply(t, changed(objectPurchase, event.StatusActive, 50, 1, onObject(object)))
	require.Equal(t, boost.Outcome{Contributions: 1}, out)
	_, ok := b.contribution(t, projectPurchase, onProject(project))
	require.True(t, ok)
	_, ok = b.contribution(t, objectPurchase, onObject(object))
	require.True(t, ok)

	// Chessboard delivers the cards later; their boost comes from the replica.
	b.upsertObject(t, objectCard(object, project, true))
	b.upsertObject(t, objectCard(unpublished, project, false))
	b.upsertProject(t, projectCard(project))

	require.Equal(t, 20, b.projectBoost(t, project))
	require.Equal(t, 70, b.objectBoost(t, object))
	require.Equal(t, 0, b.objectBoost(t, unpublished), "the project cascade reaches published objects only")
}

func TestApply_StaleVersionIsSkipped(t *testing.T) {
	b := setup(t)
	project := b.newProject(t)
	purchase := uuid.New()
	b.apply(t, changed(purchase, event.StatusActive, 30, 2, onProject(project)))

	out := b.apply(t, changed(purchase, event.StatusActive, 99, 1, onProject(project)))
	require.Equal(t, boost.Outcome{Stale: true}, out)
	c, _ := b.contribution(t, purchase, onProject(project))
	require.Equal(t, contribution{BoostWeight: 30, Status: event.StatusActive, Version: 2, Active: true}, c)
	require.Equal(t, 30, b.projectBoost(t, project))

	t.Run("equal version re-apply is harmless", func(t *testing.T) {
		card := b.xmin(t, "catalog.project_cards", project)
		out := b.apply(t, changed(purchase, event.StatusActive, 30, 2, onProject(project)))
		require.Equal(t, boost.Outcome{Contributions: 1}, out)
		require.Equal(t, 30, b.projectBoost(t, project))
		require.Equal(t, card, b.xmin(t, "catalog.project_cards", project), "the card is not rewritten")
	})

	t.Run("an old Active after the expiry does not revive the boost", func(t *testing.T) {
		b.apply(t, changed(purchase, event.StatusExpired, 30, 3, onProject(project)))
		require.Equal(t, 0, b.projectBoost(t, project))

		out := b.apply(t, changed(purchase, event.StatusActive, 30, 2, onProject(project)))
		require.Equal(t, boost.Outcome{Stale: true}, out)
		require.Equal(t, 0, b.projectBoost(t, project))
		c, _ := b.contribution(t, purchase, onProject(project))
		require.Equal(t, contribution{BoostWeight: 30, Status: event.StatusExpired, Version: 3}, c)
	})
}

func TestApply_NeverTouchesStatusVisibilityOrPrices(t *testing.T) {
	b := setup(t)
	project := b.newProject(t)
	object := b.newObject(t, project, true)
	noPrice := uuid.New()
	b.upsertObject(t, boost.PropertyObjectCard{ID: noPrice, ProjectID: project, Published: true, Status: "Reserved"})

	chessboard := func() []map[string]any {
		var rows []map[string]any
		r, err := b.db.Queryx(`SELECT id::text, title, status, visibility, min_price::text AS price,
				property_objects_available::text AS available, payback::text AS payback, NULL AS published
			FROM catalog.project_cards
			UNION ALL SELECT id::text, project_id::text, status, NULL, price::text, NULL, NULL, published::text
			FROM catalog.property_object_cards ORDER BY 1`)
		require.NoError(t, err)
		defer r.Close()
		for r.Next() {
			row := map[string]any{}
			require.NoError(t, r.MapScan(row))
			rows = append(rows, row)
		}
		require.NoError(t, r.Err())
		return rows
	}
	before := chessboard()

	purchase := uuid.New()
	b.apply(t, changed(purchase, event.StatusActive, 60, 1, onProject(project), onObject(object), onObject(noPrice)))
	require.Equal(t, 60, b.projectBoost(t, project))
	require.Equal(t, 120, b.objectBoost(t, object))
	require.Equal(t, before, chessboard(), "INV-1: status, visibility and price aggregates are unchanged")

	b.apply(t, changed(purchase, event.StatusCancelled, 60, 2, onProject(project), onObject(object), onObject(noPrice)))
	require.Equal(t, 0, b.objectBoost(t, object))
	require.Equal(t, before, chessboard())
}

func TestApply_WritesOnlyChangedCards(t *testing.T) {
	b := setup(t)
	project := b.newProject(t)
	object1 := b.newObject(t, project, true)
	object2 := b.newObject(t, project, true)
	out := b.apply(t, changed(uuid.New(), event.StatusActive, 10, 1, onProject(project)))
	require.Equal(t, 3, out.CardsRecomputed)

	xmins := func() []string {
		return []string{
			b.xmin(t, "catalog.project_cards", project),
			b.xmin(t, "catalog.property_object_cards", object1),
			b.xmin(t, "catalog.property_object_cards", object2),
		}
	}
	before := xmins()

	out = b.apply(t, changed(uuid.New(), event.StatusPending, 10, 1, onProject(project), onObject(object1)))
	require.Equal(t, 0, out.CardsRecomputed, "a Pending contribution changes no sum")
	require.Equal(t, before, xmins(), "no card row was rewritten")

	out = b.apply(t, changed(uuid.New(), event.StatusActive, 5, 1, onObject(object1)))
	require.Equal(t, 1, out.CardsRecomputed)
	after := xmins()
	require.Equal(t, before[0], after[0], "the project card is untouched")
	require.NotEqual(t, before[1], after[1], "the targeted object is written")
	require.Equal(t, before[2], after[2], "its sibling is untouched")
	require.Equal(t, 15, b.objectBoost(t, object1))
}

func TestApply_ConcurrentContributionsToOneCardAreNotLost(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	const workers, perWorker = 8, 25

	project := b.newProject(t)
	objects := make([]uuid.UUID, 6)
	for i := range objects {
		objects[i] = uuid.New()
	}
	for _, id := range objects[:4] {
		b.upsertObject(t, objectCard(id, project, true))
	}
	// objects[4] arrives from chessboard during the race; objects[5] flips
	// between unpublished and published and ends published.
	b.upsertObject(t, objectCard(objects[5], project, false))

	// applySlow holds each transaction open a little after Apply, as the
	// consumer's dedup insert and commit do, so that writers overlap.
	applySlow := func(ev event.PurchaseChanged) error {
		return inTx(ctx, b.db, func(tx *sqlx.Tx) error {
			if _, err := boost.Apply(ctx, tx, ev); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `SELECT pg_sleep(0.002)`)
			return err
		})
	}

	var wg sync.WaitGroup
	start := make(chan struct{})
	// The workers' last events start together, once the card upserts are
	// done, so that the card's last writers overlap too.
	var lastRound sync.WaitGroup
	lastRound.Add(workers + 1)
	var mu sync.Mutex
	wantProject := 0
	wantObject := map[uuid.UUID]int{}
	for w := range workers {
		wg.Go(func() {
			arrive := sync.OnceFunc(lastRound.Done)
			defer arrive()
			<-start
			for j := range perWorker {
				if j == perWorker-1 {
					arrive()
					lastRound.Wait()
				}
				n := w*perWorker + j
				purchase, object, weight := uuid.New(), objects[n%len(objects)], 1+n%100
				targets := []event.Target{onProject(project), onObject(object)}
				if !assert.NoError(t, applySlow(changed(purchase, event.StatusActive, weight, 1, targets...))) {
					return
				}
				active := n%5 != 0
				if !active {
					if !assert.NoError(t, applySlow(changed(purchase, event.StatusExpired, weight, 2, targets...))) {
						return
					}
				}
				if active {
					mu.Lock()
					wantProject += weight
					wantObject[object] += weight
					mu.Unlock()
				}
			}
		})
	}
	wg.Go(func() {
		defer lastRound.Done()
		<-start
		for i := range 40 {
			card := projectCard(project)
			card.PropertyObjectsAvailable = i
			card.PromotionBoost = -1 // must be ignored
			assert.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error { return boost.UpsertProjectCardTx(ctx, tx, card) }))
			for k, id := range objects {
				if k == 4 && i < 10 {
					continue
				}
				obj := objectCard(id, project, k != 5 || i%2 == 1)
				obj.Price = ptr("6000000.00")
				assert.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error { return boost.UpsertPropertyObjectCardTx(ctx, tx, obj) }))
			}
		}
	})
	close(start)
	wg.Wait()
	require.False(t, t.Failed())

	require.Equal(t, workers*perWorker*2, b.count(t, `SELECT count(*) FROM catalog.promotion_contributions`))
	require.Equal(t, wantProject, b.projectBoost(t, project))
	for _, id := range objects {
		require.Equal(t, wantObject[id]+wantProject, b.objectBoost(t, id), "object %s", id)
	}
}

func TestApply_SerializationFailureIsErrConflict(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	project := b.newProject(t)

	late, err := b.db.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	require.NoError(t, err)
	defer late.Rollback() //nolint:errcheck

	// The first statement takes the snapshot; then another event commits.
	_, err = late.ExecContext(ctx, `SELECT 1`)
	require.NoError(t, err)

	b.apply(t, changed(uuid.New(), event.StatusActive, 10, 1, onProject(project)))
	_, err = boost.Apply(ctx, late, changed(uuid.New(), event.StatusActive, 20, 1, onProject(project)))

	require.ErrorIs(t, err, boost.ErrConflict)
	var pqErr *pq.Error
	require.ErrorAs(t, err, &pqErr, "the driver's error stays in the chain")
	require.Equal(t, pqerror.TRSerializationFailure, pqErr.Code)
}

func TestApply_ReplayIsDeterministic(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))

	// Three projects with published and unpublished objects, plus targets
	// whose cards never arrive.
	var targets []event.Target
	var projects []uuid.UUID
	objects := map[uuid.UUID]boost.PropertyObjectCard{}
	for range 3 {
		p := b.newProject(t)
		projects = append(projects, p)
		targets = append(targets, onProject(p))
		for k := range 4 {
			o := b.newObject(t, p, k != 3)
			objects[o] = objectCard(o, p, k != 3)
			targets = append(targets, onObject(o))
		}
	}
	targets = append(targets, onProject(uuid.New()), onObject(uuid.New()), onPost(uuid.New()))

	// 40 purchases; each one's events keep their order (one Kafka key), the
	// purchases interleave, and some events are delivered twice or late.
	finals := map[uuid.UUID]event.PurchaseChanged{}
	var queues [][]event.PurchaseChanged
	for range 40 {
		id := uuid.New()
		var tg []event.Target
		for range 1 + rng.IntN(3) {
			tg = append(tg, targets[rng.IntN(len(targets))])
		}
		weight := 1 + rng.IntN(100)
		evs := []event.PurchaseChanged{changed(id, event.StatusActive, weight, 1, tg...)}
		switch rng.IntN(3) {
		case 1:
			evs = append(evs, changed(id, event.StatusExpired, weight, 2, tg...))
		case 2:
			evs = append(evs, changed(id, event.StatusCancelled, weight, 2, tg...))
		}
		if rng.IntN(4) == 0 {
			evs = append(evs, evs[0]) // a stale re-delivery
		}
		for _, ev := range evs {
			if ev.Version > finals[id].Version {
				finals[id] = ev
			}
		}
		queues = append(queues, evs)
	}
	var sequence []event.PurchaseChanged
	for len(queues) > 0 {
		i := rng.IntN(len(queues))
		sequence = append(sequence, queues[i][0])
		if queues[i] = queues[i][1:]; len(queues[i]) == 0 {
			queues = append(queues[:i], queues[i+1:]...)
		}
	}

	// What the seed's formula gives for the final state of every purchase.
	want := wantBoosts(finals, projects, objects)

	for _, ev := range sequence {
		b.apply(t, ev)
	}
	first := b.boosts(t)
	require.Equal(t, want, first)

	require.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error {
		_, err := tx.Exec(`DELETE FROM catalog.promotion_contributions;
			UPDATE catalog.project_cards SET promotion_boost = 0; UPDATE catalog.property_object_cards SET promotion_boost = 0`)
		return err
	}))
	for id, v := range b.boosts(t) {
		require.Zero(t, v, "card %s after reset", id)
	}

	for _, ev := range sequence {
		b.apply(t, ev)
	}
	require.Equal(t, first, b.boosts(t))
}
