package boost_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
)

// TestApplyBatch_EqualsTheSeedFormulaAfterEveryBatch applies random batches
// (1 to 12 events of distinct purchases: activations, transitions, stale and
// duplicate snapshots) between random card writes, and checks after each batch
// that every card equals the seed's formula over what was applied and a full
// recompute from the replica, and that each event's outcome is what it would
// be alone.
func TestApplyBatch_EqualsTheSeedFormulaAfterEveryBatch(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	w := &deltaWorld{
		rng:         rand.New(rand.NewPCG(seed, 1)),
		objectCards: map[uuid.UUID]boost.PropertyObjectCard{},
		sent:        map[uuid.UUID][]event.PurchaseChanged{},
		applied:     map[uuid.UUID]event.PurchaseChanged{},
	}
	for range 3 {
		p := uuid.New()
		w.projects = append(w.projects, p)
		w.projectCards = append(w.projectCards, p)
		b.upsertProject(t, projectCard(p))
		w.targets = append(w.targets, onProject(p))
	}
	for range 8 {
		c := objectCard(uuid.New(), w.projects[w.pick(3)], w.pick(3) > 0)
		w.objects = append(w.objects, c.ID)
		w.objectCards[c.ID] = c
		b.upsertObject(t, c)
		w.targets = append(w.targets, onObject(c.ID))
	}
	w.targets = append(w.targets, onPost(uuid.New()))

	for round := range 60 {
		var batch []event.PurchaseChanged
		var wantStale []bool
		inBatch := map[uuid.UUID]bool{}
		for range 1 + w.pick(12) {
			ev, stale := w.randomEvent()
			if inBatch[ev.PurchaseId] {
				continue
			}
			inBatch[ev.PurchaseId] = true
			batch, wantStale = append(batch, ev), append(wantStale, stale)
		}
		var outs []boost.Outcome
		require.NoError(t, inTx(ctx, b.db, func(tx *sqlx.Tx) error {
			var err error
			outs, err = boost.ApplyBatch(ctx, tx, batch)
			return err
		}))
		require.Len(t, outs, len(batch))
		for i, ev := range batch {
			require.Equal(t, wantStale[i], outs[i].Stale, "round %d event %d", round, i)
			if last, ok := w.applied[ev.PurchaseId]; !ok || ev.Version >= last.Version {
				w.applied[ev.PurchaseId] = ev
			}
		}
		if w.pick(3) == 0 {
			c := objectCard(w.objects[w.pick(len(w.objects))], w.projects[w.pick(3)], w.pick(3) > 0)
			b.upsertObject(t, c)
			w.objectCards[c.ID] = c
		}
		require.Equal(t, wantBoosts(w.applied, w.projectCards, w.objectCards), b.boosts(t), "round %d", round)
		b.requireNoDrift(t, "round %d", round)
	}
}

// randomEvent is a new purchase, the next snapshot of a live one, or an
// earlier (stale) or the latest (duplicate) snapshot of a sent one; stale
// says whether it is below the purchase's applied version.
func (w *deltaWorld) randomEvent() (event.PurchaseChanged, bool) {
	if len(w.purchases) > 0 {
		hist := w.sent[w.purchases[w.pick(len(w.purchases))]]
		switch r := w.pick(10); {
		case r < 4:
			if ev, ok := w.next(hist[len(hist)-1]); ok {
				w.sent[ev.PurchaseId] = append(hist, ev)
				return ev, false
			}
		case r < 5 && len(hist) > 1:
			ev := hist[w.pick(len(hist)-1)]
			return ev, ev.Version < w.applied[ev.PurchaseId].Version && hasCardTarget(ev)
		case r < 6:
			return hist[len(hist)-1], false
		}
	}
	ev := w.newPurchase()
	w.purchases = append(w.purchases, ev.PurchaseId)
	w.sent[ev.PurchaseId] = []event.PurchaseChanged{ev}
	return ev, false
}

func hasCardTarget(ev event.PurchaseChanged) bool {
	for _, t := range ev.Targets {
		if t.TargetKind != event.TargetPost {
			return true
		}
	}
	return false
}
