package router_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/router/rebuild"
)

// TestCatalog_SnapshotHistoriesAgreeLiveRebuildAndModel: for version
// histories that grow and shrink the target sets of a few purchases over a
// few cards, the live projection, a rebuild of the same topic after
// compaction removed superseded versions, and a model of the snapshot rule
// (each purchase's latest version alone counts) agree on every contribution
// and every card. Each purchase's versions are written in increasing order,
// the contract's rule that keeps a compacted topic complete.
func TestCatalog_SnapshotHistoriesAgreeLiveRebuildAndModel(t *testing.T) {
	b := setupCatalog(t, true)
	// Compaction as soon as a segment closes: a segment rolls at the first
	// record 100 ms after it opened, and 1% of superseded records is enough.
	b.Cfg.Topic = kafkatest.TopicConfigured(t, 1, map[string]string{"cleanup.policy": "compact",
		"segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"})
	b.Start(t)
	m := snapshotModel{latest: map[uuid.UUID]event.PurchaseChanged{}, published: map[uuid.UUID]uuid.UUID{},
		projects: map[uuid.UUID]bool{}}
	produced := 0

	rapid.Check(t, func(rt *rapid.T) {
		cards := m.cards(t, b)
		histories := rapid.SliceOfN(snapshotHistory(cards), 1, 3).Draw(rt, "histories")
		for _, ev := range interleave(rt, histories) {
			b.Produce(t, ev)
			produced++
			m.latest[ev.PurchaseId] = ev
		}
		ids := make([]uuid.UUID, len(histories))
		for i, h := range histories {
			ids[i] = h[0].PurchaseId
		}
		want := m.contributions(ids...)
		waitFor(rt, func() bool { return slices.Equal(want, replica(t, b, ids...)) },
			func() string { return "replica: want " + show(want) + ", have " + show(replica(t, b, ids...)) })
		waitFor(rt, func() bool { return maps.Equal(m.boosts(), b.CardBoosts(t)) },
			func() string { return "cards: want " + show(m.boosts()) + ", have " + show(b.CardBoosts(t)) })
	})

	// Records of purchases of Post targets only (the consumer acks them,
	// the rebuild skips them) roll the segment until the cleaner has removed
	// superseded versions.
	require.Eventually(t, func() bool {
		b.Produce(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 1, catalogtest.Target(event.TargetPost, uuid.New())))
		produced++
		return catalogtest.TopicSize(t, b.Cfg.Topic) < int64(produced)
	}, 45*time.Second, 500*time.Millisecond, "the topic was not compacted")

	all := slices.Collect(maps.Keys(m.latest))
	want := m.contributions(all...)
	require.Equal(t, want, replica(t, b, all...), "live replica")
	live := b.CardBoosts(t)
	require.Equal(t, m.boosts(), live, "live cards")
	rb, err := rebuild.New(rebuild.Config{DB: b.DB, Kafka: b.Cfg.Kafka, Topic: b.Cfg.Topic, Log: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(rb.Stop)
	st, err := rb.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, rebuild.StateDone, st.State)
	require.Less(t, st.Read, int64(produced), "the rebuild read a compacted topic")
	require.Equal(t, want, replica(t, b, all...), "rebuilt replica")
	require.Equal(t, live, b.CardBoosts(t), "rebuilt cards")
}

// snapshotModel is the projection the snapshot rule predicts: each purchase's
// latest event, and the cards the test made.
type snapshotModel struct {
	latest map[uuid.UUID]event.PurchaseChanged
	// published maps every object card to its project, for those published;
	// projects names every project card. Unpublished objects are in neither.
	published map[uuid.UUID]uuid.UUID
	projects  map[uuid.UUID]bool
	objects   []uuid.UUID
}

// cards makes the cards of one check: two projects, a published and an
// unpublished object of the first, a published object of the second; it
// returns them as the targets a history draws from.
func (m *snapshotModel) cards(t *testing.T, b *catalogtest.Bundle) []event.Target {
	p0, p1, o0, hidden, o1 := uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New()
	for _, p := range []uuid.UUID{p0, p1} {
		b.ProjectCard(t, p)
		m.projects[p] = true
	}
	b.ObjectCard(t, o0, p0, true)
	b.ObjectCard(t, hidden, p0, false)
	b.ObjectCard(t, o1, p1, true)
	m.published[o0], m.published[o1] = p0, p1
	m.objects = append(m.objects, o0, hidden, o1)
	return []event.Target{catalogtest.Target(event.TargetProject, p0), catalogtest.Target(event.TargetProject, p1),
		catalogtest.Target(event.TargetPropertyObject, o0), catalogtest.Target(event.TargetPropertyObject, hidden),
		catalogtest.Target(event.TargetPropertyObject, o1)}
}

// snapshotHistory draws the versions of one purchase, in increasing order:
// each a non-empty subset of cards (at times with a Post target beside), a
// status and a weight of its own.
func snapshotHistory(cards []event.Target) *rapid.Generator[[]event.PurchaseChanged] {
	return rapid.Custom(func(rt *rapid.T) []event.PurchaseChanged {
		base := catalogtest.PurchaseEvent(event.StatusActive, 1, 1)
		n := rapid.IntRange(1, 4).Draw(rt, "versions")
		out := make([]event.PurchaseChanged, n)
		version := int64(0)
		for i := range out {
			ev := base
			version += int64(rapid.IntRange(1, 2).Draw(rt, "step"))
			ev.Version = version
			ev.Targets = rapid.SliceOfNDistinct(rapid.SampledFrom(cards), 1, len(cards), func(t event.Target) event.Target { return t }).
				Draw(rt, "targets")
			if rapid.Bool().Draw(rt, "post") {
				ev.Targets = append(ev.Targets, catalogtest.Target(event.TargetPost, uuid.New()))
			}
			ev.Status = rapid.SampledFrom([]event.Status{event.StatusActive, event.StatusActive, event.StatusExpired,
				event.StatusCancelled}).Draw(rt, "status")
			ev.BoostWeight = rapid.IntRange(1, 100).Draw(rt, "weight")
			out[i] = ev
		}
		return out
	})
}

// interleave merges the histories in an order rapid draws, each history's
// events in their own order.
func interleave(rt *rapid.T, histories [][]event.PurchaseChanged) []event.PurchaseChanged {
	var out []event.PurchaseChanged
	next := make([]int, len(histories))
	for {
		var open []int
		for i, h := range histories {
			if next[i] < len(h) {
				open = append(open, i)
			}
		}
		if len(open) == 0 {
			return out
		}
		i := rapid.SampledFrom(open).Draw(rt, "next")
		out = append(out, histories[i][next[i]])
		next[i]++
	}
}

// modelRow is one contribution: what the replica holds of it.
type modelRow struct {
	PurchaseID uuid.UUID        `db:"purchase_id"`
	Kind       event.TargetKind `db:"target_kind"`
	TargetID   uuid.UUID        `db:"target_id"`
	Weight     int              `db:"boost_weight"`
	Status     event.Status     `db:"status"`
	Version    int64            `db:"version"`
	Active     bool             `db:"active"`
}

func compareRows(x, y modelRow) int {
	if c := slices.Compare(x.PurchaseID[:], y.PurchaseID[:]); c != 0 {
		return c
	}
	if x.Kind != y.Kind {
		return map[bool]int{true: -1, false: 1}[x.Kind < y.Kind]
	}
	return slices.Compare(x.TargetID[:], y.TargetID[:])
}

// contributions are the model's rows of the given purchases, sorted: one per
// distinct card target of each one's latest event.
func (m *snapshotModel) contributions(ids ...uuid.UUID) []modelRow {
	out := []modelRow{}
	for _, id := range ids {
		ev := m.latest[id]
		for _, tg := range ev.Targets {
			if tg.TargetKind == event.TargetPost {
				continue
			}
			out = append(out, modelRow{PurchaseID: id, Kind: tg.TargetKind, TargetID: tg.TargetId, Weight: ev.BoostWeight,
				Status: ev.Status, Version: ev.Version, Active: ev.Status == event.StatusActive})
		}
	}
	slices.SortFunc(out, compareRows)
	return out
}

// boosts is every card's boost by the seed's formula over the model's rows.
func (m *snapshotModel) boosts() map[uuid.UUID]int {
	sums := map[event.Target]int{}
	for _, r := range m.contributions(slices.Collect(maps.Keys(m.latest))...) {
		if r.Active {
			sums[catalogtest.Target(r.Kind, r.TargetID)] += r.Weight
		}
	}
	out := map[uuid.UUID]int{}
	for p := range m.projects {
		out[p] = sums[catalogtest.Target(event.TargetProject, p)]
	}
	for _, o := range m.objects {
		out[o] = sums[catalogtest.Target(event.TargetPropertyObject, o)]
		if p, ok := m.published[o]; ok {
			out[o] += sums[catalogtest.Target(event.TargetProject, p)]
		}
	}
	return out
}

// replica is the replica's rows of the given purchases, sorted as the model's.
func replica(t *testing.T, b *catalogtest.Bundle, ids ...uuid.UUID) []modelRow {
	out := []modelRow{}
	strs := make([]string, len(ids))
	for i, id := range ids {
		strs[i] = id.String()
	}
	require.NoError(t, b.DB.Select(&out, `SELECT purchase_id, target_kind, target_id, boost_weight, status, version, active
		FROM catalog.promotion_contributions WHERE purchase_id = ANY($1::uuid[])`, pq.Array(strs)))
	slices.SortFunc(out, compareRows)
	return out
}

// waitFor polls cond until it holds, and fails the check with msg() after
// 15 s (a failing check runs again while rapid shrinks it).
func waitFor(rt *rapid.T, cond func() bool, msg func() string) {
	rt.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			rt.Fatalf("%s", msg())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func show(v any) string { return fmt.Sprintf("%+v", v) }
