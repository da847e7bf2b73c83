package catalogtest

import (
	"cmp"
	"fmt"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
)

// The projection a test's events must give, folded in Go independently of
// the consumer's SQL: each purchase's latest event alone counts (it is the
// purchase's full state), and a card's boost is the seed's formula over the
// rows it gives.

// Contribution is one row of catalog.promotion_contributions.
type Contribution struct {
	PurchaseID uuid.UUID        `db:"purchase_id"`
	Kind       event.TargetKind `db:"target_kind"`
	TargetID   uuid.UUID        `db:"target_id"`
	Weight     int              `db:"boost_weight"`
	Status     event.Status     `db:"status"`
	Version    int64            `db:"version"`
	Active     bool             `db:"active"`
}

// String is the row in one line, for failure messages.
func (c Contribution) String() string {
	return fmt.Sprintf("purchase %s %s %s weight %d %s v%d", c.PurchaseID, c.Kind, c.TargetID, c.Weight, c.Status, c.Version)
}

func compareContributions(x, y Contribution) int {
	return cmp.Or(slices.Compare(x.PurchaseID[:], y.PurchaseID[:]), cmp.Compare(x.Kind, y.Kind),
		slices.Compare(x.TargetID[:], y.TargetID[:]))
}

// ModelContributions are the rows the replica must hold for the purchases
// whose latest events are given: one per purchase and distinct card target,
// sorted by purchase, kind and target.
func ModelContributions(latest map[uuid.UUID]event.PurchaseChanged) []Contribution {
	out := []Contribution{}
	for _, ev := range latest {
		seen := map[event.Target]bool{}
		for _, tg := range ev.Targets {
			if seen[tg] || tg.TargetKind == event.TargetPost {
				continue
			}
			seen[tg] = true
			out = append(out, Contribution{PurchaseID: ev.PurchaseId, Kind: tg.TargetKind, TargetID: tg.TargetId,
				Weight: ev.BoostWeight, Status: ev.Status, Version: ev.Version, Active: ev.Status == event.StatusActive})
		}
	}
	slices.SortFunc(out, compareContributions)
	return out
}

// ModelBoosts is the seed's formula over rows, for every card of b: a
// project's boost is the sum of its active Project contributions; an
// object's is the sum of its own plus, while published, its project's.
func (b *Bundle) ModelBoosts(t testing.TB, rows []Contribution) map[uuid.UUID]int {
	t.Helper()
	sum := map[event.Target]int{}
	for _, c := range rows {
		if c.Active {
			sum[Target(c.Kind, c.TargetID)] += c.Weight
		}
	}
	var projects []uuid.UUID
	require.NoError(t, b.DB.Select(&projects, `SELECT id FROM catalog.project_cards`))
	var objects []struct {
		ID        uuid.UUID `db:"id"`
		ProjectID uuid.UUID `db:"project_id"`
		Published bool      `db:"published"`
	}
	require.NoError(t, b.DB.Select(&objects, `SELECT id, project_id, published FROM catalog.property_object_cards`))
	want := map[uuid.UUID]int{}
	for _, p := range projects {
		want[p] = sum[Target(event.TargetProject, p)]
	}
	for _, o := range objects {
		want[o.ID] = sum[Target(event.TargetPropertyObject, o.ID)]
		if o.Published {
			want[o.ID] += sum[Target(event.TargetProject, o.ProjectID)]
		}
	}
	return want
}

// Replica reads the replica's rows of the given purchases, or all of them
// when none is given, sorted as ModelContributions sorts them.
func (b *Bundle) Replica(t testing.TB, purchases ...uuid.UUID) []Contribution {
	t.Helper()
	out := []Contribution{}
	ids := make([]string, len(purchases))
	for i, id := range purchases {
		ids[i] = id.String()
	}
	require.NoError(t, b.DB.Select(&out, `SELECT purchase_id, target_kind, target_id, boost_weight, status, version, active
		FROM catalog.promotion_contributions WHERE $1 OR purchase_id = ANY($2::uuid[])`, len(ids) == 0, pq.Array(ids)))
	slices.SortFunc(out, compareContributions)
	return out
}
