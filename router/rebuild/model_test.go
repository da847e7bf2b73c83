package rebuild_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/catalogtest"
)

// history is every record a test sent to the purchase topic, and the model of
// the projection those records must produce: a fold in Go of the events,
// independent of the consumer's SQL (per purchase the highest version wins;
// a card's boost is the seed's formula over the winners).
type history struct {
	mu      sync.Mutex
	records int
	events  map[string]event.PurchaseChanged // by MessageId
}

// produce sends ev as the relay would and records it.
func (h *history) produce(t *testing.T, b *catalogtest.Bundle, ev event.PurchaseChanged) *message.Message {
	t.Helper()
	msg := b.Produce(t, ev)
	h.add(msg.UUID, ev)
	return msg
}

// redeliver sends msg (of ev) once more with its MessageId: a duplicate record.
func (h *history) redeliver(t *testing.T, b *catalogtest.Bundle, msg *message.Message, ev event.PurchaseChanged) {
	t.Helper()
	require.NoError(t, b.Pub.Publish(b.Cfg.Topic, msg))
	h.add(msg.UUID, ev)
}

func (h *history) add(id string, ev event.PurchaseChanged) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.events == nil {
		h.events = map[string]event.PurchaseChanged{}
	}
	h.events[id] = ev
	h.records++
}

// sent is how many records were sent, duplicates included.
func (h *history) sent() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.records
}

// latest is each purchase's event of the highest version.
func (h *history) latest() map[uuid.UUID]event.PurchaseChanged {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[uuid.UUID]event.PurchaseChanged{}
	for _, ev := range h.events {
		if cur, ok := out[ev.PurchaseId]; !ok || ev.Version > cur.Version {
			out[ev.PurchaseId] = ev
		}
	}
	return out
}

// dedupKeys are the dedup keys of every distinct MessageId sent.
func (h *history) dedupKeys() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.events))
	for id := range h.events {
		out = append(out, middleware.DedupKeyPrefixDefault+id)
	}
	return out
}

// contributions are the rows the replica must hold: one per purchase and
// distinct card target, from the purchase's latest event.
func (h *history) contributions() []catalogtest.Contribution {
	return catalogtest.ModelContributions(h.latest())
}

// requireModel checks the replica and every card's boost against the model,
// and lists every row and card that differs.
func requireModel(t *testing.T, b *catalogtest.Bundle, h *history, what string) {
	t.Helper()
	if diff := modelDiff(t, b, h); len(diff) > 0 {
		t.Fatalf("%s: the projection differs from the model of the events sent:\n\t%s", what, strings.Join(diff, "\n\t"))
	}
}

// modelDiff lists, one line each, the replica rows and the card boosts that
// differ from the model.
func modelDiff(t *testing.T, b *catalogtest.Bundle, h *history) []string {
	t.Helper()
	var diff []string
	want, have := map[catalogtest.Contribution]bool{}, map[catalogtest.Contribution]bool{}
	for _, c := range h.contributions() {
		want[c] = true
	}
	for _, c := range b.Replica(t) {
		have[c] = true
		if !want[c] {
			diff = append(diff, "replica has a row the events do not give: "+c.String())
		}
	}
	for c := range want {
		if !have[c] {
			diff = append(diff, "replica lacks: "+c.String())
		}
	}
	boosts := b.CardBoosts(t)
	for id, w := range b.ModelBoosts(t, h.contributions()) {
		if boosts[id] != w {
			diff = append(diff, fmt.Sprintf("card %s: boost %d, the model's %d", id, boosts[id], w))
		}
	}
	slices.Sort(diff)
	return diff
}

// corruptedAfterHistory is a running catalog that consumed a history of 12
// purchases per card set, whose projection was then corrupted.
func corruptedAfterHistory(t *testing.T) (b *catalogtest.Bundle, h *history, projects, objects []uuid.UUID) {
	b = setup(t)
	projects, objects = cards(t, b)
	b.Start(t)
	h = &history{}
	produceHistory(t, b, h, projects, objects, 12)
	corrupt(t, b, h)
	return b, h, projects, objects
}

// corrupt damages the projection as a lost write or a hand edit would: one
// card's boost off, one active contribution gone, a bogus contribution and a
// bogus dedup mark added. It checks that the projection no longer matches the
// model, so that only a rebuild that resets can pass afterwards.
func corrupt(t *testing.T, b *catalogtest.Bundle, h *history) {
	t.Helper()
	requireModel(t, b, h, "before the corruption")
	exec := func(query string, args ...any) {
		t.Helper()
		res, err := b.DB.Exec(query, args...)
		require.NoError(t, err, query)
		n, err := res.RowsAffected()
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "corruption %q changes one row", query)
	}
	exec(`UPDATE catalog.project_cards SET promotion_boost = promotion_boost + 13
		WHERE id = (SELECT id FROM catalog.project_cards ORDER BY id LIMIT 1)`)
	exec(`DELETE FROM catalog.promotion_contributions
		WHERE (purchase_id, target_kind, target_id) = (SELECT purchase_id, target_kind, target_id
			FROM catalog.promotion_contributions WHERE active ORDER BY purchase_id LIMIT 1)`)
	exec(`INSERT INTO catalog.promotion_contributions
		(purchase_id, target_kind, target_id, boost_weight, status, version, active, ends_at)
		SELECT $1, 'Project', id, 42, 'Active', 9, true, now() + interval '1 hour'
		FROM catalog.project_cards ORDER BY id DESC LIMIT 1`, uuid.New())
	exec(`INSERT INTO catalog.processed_messages (key) VALUES ($1)`, middleware.DedupKeyPrefixDefault+uuid.NewString())
	require.Len(t, modelDiff(t, b, h), 3, "the corruption shows as a card off, a row missing and a bogus row")
}

// dedupMarks are the keys of catalog.processed_messages.
func dedupMarks(t *testing.T, b *catalogtest.Bundle) []string {
	t.Helper()
	var keys []string
	require.NoError(t, b.DB.Select(&keys, `SELECT key FROM catalog.processed_messages`))
	return keys
}

// buildTables are the tables of rebuilds in the catalog schema.
func buildTables(t *testing.T, b *catalogtest.Bundle) []string {
	t.Helper()
	var tables []string
	require.NoError(t, b.DB.Select(&tables, `SELECT relname FROM pg_class
		WHERE relnamespace = 'catalog'::regnamespace AND relname LIKE 'rebuild\_%'`))
	return tables
}

// requireNoBuildTables checks that no rebuild left a table of its own.
func requireNoBuildTables(t *testing.T, b *catalogtest.Bundle) {
	t.Helper()
	require.Empty(t, buildTables(t, b), "tables of a rebuild are left")
}

// produceHistory sends n purchases on projects and objects (from cards), with
// redelivered records, removals and stale snapshots after a removal, and
// waits until the consumer handled them all.
func produceHistory(t *testing.T, b *catalogtest.Bundle, h *history, projects, objects []uuid.UUID, n int) {
	t.Helper()
	for i := range n {
		ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 1+i, catalogtest.Target(event.TargetProject, projects[i%len(projects)]),
			catalogtest.Target(event.TargetPropertyObject, objects[i%len(objects)]))
		msg := h.produce(t, b, ev)
		if i%4 == 1 {
			h.redeliver(t, b, msg, ev)
		}
		if i%3 == 0 {
			removed := ev
			removed.Status, removed.Version = []event.Status{event.StatusExpired, event.StatusCancelled}[i%2], 2
			h.produce(t, b, removed)
			h.produce(t, b, ev) // a stale snapshot after the removal
		}
	}
	b.WaitConsumed(t, float64(h.sent()), 30*time.Second)
}

// view is what one statement reads of the projection: every card's boost and
// every replica row, each sorted, one line a card or a row.
type view struct {
	Cards   string `db:"cards"`
	Replica string `db:"replica"`
}

// cardsSQL and replicaSQL read the two halves of a view.
const (
	cardsSQL = `coalesce((SELECT string_agg(id || '=' || promotion_boost, E'\n' ORDER BY id) FROM (
		SELECT id, promotion_boost FROM catalog.project_cards
		UNION ALL SELECT id, promotion_boost FROM catalog.property_object_cards) c), '')`
	replicaSQL = `coalesce((SELECT string_agg(concat_ws(' ', purchase_id, target_kind, target_id, boost_weight, status, version, active),
		E'\n' ORDER BY purchase_id, target_kind, target_id) FROM catalog.promotion_contributions), '')`
)

// readView reads the projection in one statement, so in one snapshot, as a
// reader does; cardsOnly reads the cards alone, as the storefront does.
func readView(ctx context.Context, b *catalogtest.Bundle, cardsOnly bool) (view, error) {
	var v view
	query := `SELECT ` + cardsSQL + ` AS cards, ` + replicaSQL + ` AS replica`
	if cardsOnly {
		query = `SELECT ` + cardsSQL + ` AS cards, '' AS replica`
	}
	err := b.DB.GetContext(ctx, &v, query)
	return v, err
}

// requireView reads the projection and checks it is want.
func requireView(t *testing.T, b *catalogtest.Bundle, want view, what string) {
	t.Helper()
	have, err := readView(t.Context(), b, false)
	require.NoError(t, err)
	require.Equal(t, want.Cards, have.Cards, "%s: card boosts", what)
	require.Equal(t, want.Replica, have.Replica, "%s: replica", what)
}
