package router_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
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
	latest := map[uuid.UUID]event.PurchaseChanged{} // the model: each purchase's latest event
	produced := 0

	rapid.Check(t, func(rt *rapid.T) {
		cards := snapshotCards(t, b)
		histories := rapid.SliceOfN(snapshotHistory(cards), 1, 3).Draw(rt, "histories")
		mine := map[uuid.UUID]event.PurchaseChanged{}
		for _, ev := range interleave(rt, histories) {
			b.Produce(t, ev)
			produced++
			latest[ev.PurchaseId], mine[ev.PurchaseId] = ev, ev
		}
		want, ids := catalogtest.ModelContributions(mine), slices.Collect(maps.Keys(mine))
		waitFor(rt, func() bool { return slices.Equal(want, b.Replica(t, ids...)) },
			func() string { return fmt.Sprintf("replica: want %v, have %v", want, b.Replica(t, ids...)) })
		boosts := b.ModelBoosts(t, catalogtest.ModelContributions(latest))
		waitFor(rt, func() bool { return maps.Equal(boosts, b.CardBoosts(t)) },
			func() string { return fmt.Sprintf("cards: want %v, have %v", boosts, b.CardBoosts(t)) })
	})

	// Records of purchases of Post targets only (the consumer acks them,
	// the rebuild skips them) roll the segment until the cleaner has removed
	// superseded versions.
	require.Eventually(t, func() bool {
		b.Produce(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 1, catalogtest.Target(event.TargetPost, uuid.New())))
		produced++
		return catalogtest.TopicSize(t, b.Cfg.Topic) < int64(produced)
	}, 45*time.Second, 500*time.Millisecond, "the topic was not compacted")

	want := catalogtest.ModelContributions(latest)
	require.Equal(t, want, b.Replica(t), "live replica")
	live := b.CardBoosts(t)
	require.Equal(t, b.ModelBoosts(t, want), live, "live cards")
	st := runRebuild(t, b)
	require.Less(t, st.Read, int64(produced), "the rebuild read a compacted topic")
	require.Equal(t, want, b.Replica(t), "rebuilt replica")
	require.Equal(t, live, b.CardBoosts(t), "rebuilt cards")
}

// snapshotCards makes the cards of one check: two projects, a published and
// an unpublished object of the first, a published object of the second; it
// returns them as the targets a history draws from.
func snapshotCards(t *testing.T, b *catalogtest.Bundle) []event.Target {
	p0, p1, o0, hidden, o1 := uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New()
	b.ProjectCard(t, p0)
	b.ProjectCard(t, p1)
	b.ObjectCard(t, o0, p0, true)
	b.ObjectCard(t, hidden, p0, false)
	b.ObjectCard(t, o1, p1, true)
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
