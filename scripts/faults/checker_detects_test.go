package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// world is a crafted purchase topic, promotion table, set of ids answered
// 201 and cards, written to a real PostgreSQL and Kafka and read back by the
// checker as a fault scenario reads them.
type world struct {
	projects  [2]uuid.UUID
	objects   []craftedObject
	purchases map[string]*craftedPurchase
	// extra are records of no crafted purchase.
	extra     []craftedRecord
	created   []uuid.UUID
	malformed map[string]bool
	// cardDelta is added to a card's boost after it is computed from the rows.
	cardDelta map[uuid.UUID]int
	// truncated: the topic's first record is deleted (DeleteRecords), as
	// retention would.
	truncated bool
	// lost and reconciled are the evidence's sets of those names.
	lost, reconciled map[uuid.UUID]bool
	// phantoms are the evidence's phantoms.
	phantoms map[string]bool
}

type craftedObject struct {
	id, project uuid.UUID
	published   bool
}

type craftedPurchase struct {
	name    string
	base    event.PurchaseChanged
	row     *purchaseRow // nil: no row
	records []craftedRecord
}

type craftedRecord struct {
	key, messageID string
	value          []byte
}

// newWorld is a world the checker must find clean:
//   - A: Active v1 ending in hours, on project P0 and object O2, its v1
//     redelivered (same MessageId, same bytes);
//   - B: Expired v2 on project P1;
//   - C: Cancelled v2 on the unpublished object O1;
//   - D: Active v1 on project P1;
//   - a malformed record under a key marked malformed;
//   - R: a reconciled purchase, L: one lost by a failover, X: a phantom
//     expiry followed by the promoted database's own;
//
// with cards P0, P1, O0 (published, P0), O1 (unpublished, P0), O2 and O3
// (published, P1) at their true boosts, five of six of them non-zero.
func newWorld() *world {
	w := &world{projects: [2]uuid.UUID{uuid.New(), uuid.New()}, purchases: map[string]*craftedPurchase{},
		malformed: map[string]bool{}, cardDelta: map[uuid.UUID]int{}, lost: map[uuid.UUID]bool{}, reconciled: map[uuid.UUID]bool{},
		phantoms: map[string]bool{}}
	for i, pub := range []bool{true, false, true, true} {
		w.objects = append(w.objects, craftedObject{id: uuid.New(), project: w.projects[i/2], published: pub})
	}
	project := func(i int) event.Target {
		return event.Target{TargetKind: event.TargetProject, TargetId: w.projects[i]}
	}
	object := func(i int) event.Target {
		return event.Target{TargetKind: event.TargetPropertyObject, TargetId: w.objects[i].id}
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	add := func(name string, weight int, ends time.Duration, targets ...event.Target) *craftedPurchase {
		p := &craftedPurchase{name: name, base: event.PurchaseChanged{PurchaseId: uuid.New(), TenantId: uuid.New(),
			PackageKind: "Top", Targets: targets, BoostWeight: weight, Status: event.StatusActive, PaymentStatus: "NotRequired",
			StartsAt: now.Add(-time.Minute), EndsAt: now.Add(ends), Version: 1}}
		w.purchases[name] = p
		w.created = append(w.created, p.base.PurchaseId)
		return p
	}
	a := add("A", 7, 3*time.Hour, project(0), object(2))
	a.publish(event.StatusActive, 1)
	a.records = append(a.records, a.records[0])
	b := add("B", 3, -time.Second, project(1))
	b.publish(event.StatusActive, 1)
	b.publish(event.StatusExpired, 2)
	c := add("C", 4, time.Hour, object(1))
	c.publish(event.StatusActive, 1)
	c.publish(event.StatusCancelled, 2)
	d := add("D", 9, 2*time.Hour, project(1))
	d.publish(event.StatusActive, 1)
	// R: a cancel that a failover lost, published all the same, then the
	// database's truth written again by reconcile.
	r := add("R", 5, time.Hour, project(0))
	r.publish(event.StatusActive, 1)
	r.publish(event.StatusCancelled, 2)
	r.publish(event.StatusActive, 3)
	w.reconciled[r.base.PurchaseId] = true
	// X: expired by a primary that failed over before its standby had the
	// expiry (a phantom), then expired again by the promoted standby.
	x := add("X", 2, -time.Second, project(1))
	x.publish(event.StatusActive, 1)
	w.phantoms[x.publish(event.StatusExpired, 2).messageID] = true
	x.publish(event.StatusExpired, 2)
	for _, p := range w.purchases {
		p.setRow(p.records[len(p.records)-1])
	}
	// L: answered 201 by a primary that failed over before its standby had it.
	lost := uuid.New()
	w.created = append(w.created, lost)
	w.lost[lost] = true
	key := uuid.NewString()
	w.malformed[key] = true
	w.extra = append(w.extra, craftedRecord{key: key, value: []byte(`{"PurchaseId": 7, "Status":"Frozen"`)})
	return w
}

// another adds a purchase named name, like the purchase like but with an id
// of its own, with no records yet; created: the API answered 201 for it.
func (w *world) another(name, like string, created bool) *craftedPurchase {
	p := &craftedPurchase{name: name, base: w.purchases[like].base}
	p.base.PurchaseId = uuid.New()
	w.purchases[name] = p
	if created {
		w.created = append(w.created, p.base.PurchaseId)
	}
	return p
}

// publish appends the purchase's event at version and status to its records.
func (p *craftedPurchase) publish(status event.Status, version int64) craftedRecord {
	ev := p.base
	ev.Status, ev.Version = status, version
	raw, err := json.Marshal(ev)
	if err != nil {
		panic(err)
	}
	r := craftedRecord{key: ev.PurchaseId.String(), messageID: uuid.NewString(), value: raw}
	p.records = append(p.records, r)
	return r
}

// setRow makes the purchase's row the state rec carries.
func (p *craftedPurchase) setRow(rec craftedRecord) {
	var ev event.PurchaseChanged
	if err := json.Unmarshal(rec.value, &ev); err != nil {
		panic(err)
	}
	targets, err := json.Marshal(ev.Targets)
	if err != nil {
		panic(err)
	}
	p.row = &purchaseRow{ID: ev.PurchaseId, TenantID: ev.TenantId, PackageKind: ev.PackageKind, Targets: targets,
		BoostWeight: ev.BoostWeight, Status: ev.Status, PaymentStatus: ev.PaymentStatus, StartsAt: ev.StartsAt,
		EndsAt: ev.EndsAt, Version: ev.Version}
}

// drop removes the purchase's records at version.
func (p *craftedPurchase) drop(version int64) {
	p.records = slices.DeleteFunc(p.records, func(r craftedRecord) bool {
		var ev event.PurchaseChanged
		return json.Unmarshal(r.value, &ev) == nil && ev.Version == version
	})
}

// boosts are the cards' boosts the world's Active rows imply, plus cardDelta.
func (w *world) boosts() map[uuid.UUID]int {
	sums := map[event.Target]int{}
	for _, p := range w.purchases {
		if p.row == nil || p.row.Status != event.StatusActive {
			continue
		}
		var targets []event.Target
		if err := json.Unmarshal(p.row.Targets, &targets); err != nil {
			panic(err)
		}
		for _, t := range targets {
			sums[t] += p.row.BoostWeight
		}
	}
	out := map[uuid.UUID]int{}
	for _, id := range w.projects {
		out[id] = sums[event.Target{TargetKind: event.TargetProject, TargetId: id}] + w.cardDelta[id]
	}
	for _, o := range w.objects {
		out[o.id] = sums[event.Target{TargetKind: event.TargetPropertyObject, TargetId: o.id}] + w.cardDelta[o.id]
		if o.published {
			out[o.id] += sums[event.Target{TargetKind: event.TargetProject, TargetId: o.project}]
		}
	}
	return out
}

// check writes the world to a database and a topic of the test's own and
// returns what the checker reports.
func (w *world) check(t *testing.T) []violation {
	t.Helper()
	ctx := context.Background()
	db := pgtest.DB(t)
	boosts := w.boosts()
	for _, id := range w.projects {
		_, err := db.Exec(`INSERT INTO catalog.project_cards (id, status, visibility, promotion_boost)
			VALUES ($1, 'Published', 'Visible', $2)`, id, boosts[id])
		require.NoError(t, err)
	}
	for _, o := range w.objects {
		_, err := db.Exec(`INSERT INTO catalog.property_object_cards (id, project_id, published, status, promotion_boost)
			VALUES ($1, $2, $3, 'OnSale', $4)`, o.id, o.project, o.published, boosts[o.id])
		require.NoError(t, err)
	}
	var records []craftedRecord
	for _, name := range slices.Sorted(maps.Keys(w.purchases)) {
		p := w.purchases[name]
		records = append(records, p.records...)
		if r := p.row; r != nil {
			_, err := db.Exec(`INSERT INTO promotion.promotion_purchases (id, tenant_id, package_kind, targets,
				boost_weight, status, payment_status, starts_at, ends_at, created_at, updated_at, version)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now(), now(), $10)`, r.ID, r.TenantID, r.PackageKind,
				string(r.Targets), r.BoostWeight, r.Status, r.PaymentStatus, r.StartsAt, r.EndsAt, r.Version)
			require.NoError(t, err)
		}
	}
	records = append(records, w.extra...)

	topic := kafkatest.Topic(t, 3)
	producer, err := sarama.NewSyncProducer(kafkatest.Brokers(t), kafkatest.Cluster(t).DurableProducerConfig("promoflow-test"))
	require.NoError(t, err)
	defer producer.Close()
	head := map[int32]int64{}
	for _, r := range records {
		msg := &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(r.key), Value: sarama.ByteEncoder(r.value)}
		if r.messageID != "" {
			msg.Headers = []sarama.RecordHeader{{Key: []byte(kafka.UUIDHeaderKey), Value: []byte(r.messageID)}}
		}
		partition, offset, err := producer.SendMessage(msg)
		require.NoError(t, err)
		if w.truncated && len(head) == 0 {
			head[partition] = offset + 1
		}
	}
	if w.truncated {
		admin, err := sarama.NewClusterAdmin(kafkatest.Brokers(t), kafkatest.Cluster(t).ClientConfig("promoflow-test"))
		require.NoError(t, err)
		defer admin.Close()
		require.NoError(t, admin.DeleteRecords(topic, head))
	}

	removed, recs, err := readTopic(ctx, kafkatest.Cluster(t), topic)
	require.NoError(t, err)
	rows, err := readPurchases(ctx, db)
	require.NoError(t, err)
	cards, err := readCards(ctx, db)
	require.NoError(t, err)
	created := map[uuid.UUID]bool{}
	for _, id := range w.created {
		created[id] = true
	}
	ev := evidence{removed: removed, records: recs, rows: rows, created: created, malformed: w.malformed,
		lost: w.lost, reconciled: w.reconciled, phantoms: w.phantoms}
	return append(ev.violations(), checkCards(cards)...)
}

// TestChecker_DetectsEachViolation crafts, on the real PostgreSQL and Kafka,
// one world per rule the fault scenarios rely on, each broken once, and
// requires the checker to report that break about that purchase or card; an
// unbroken world reports nothing.
func TestChecker_DetectsEachViolation(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		brk   func(w *world) (subject string)
		wants violationKind
	}{
		{"lost v1", func(w *world) string {
			w.purchases["B"].drop(1)
			return w.purchases["B"].base.PurchaseId.String()
		}, lostVersion},
		{"lost middle version", func(w *world) string {
			// E: Active v1, Active v2 (weight changed), Expired v3; v2 lost.
			e := w.another("E", "B", true)
			e.publish(event.StatusActive, 1)
			e.base.BoostWeight = 8
			e.publish(event.StatusActive, 2)
			e.setRow(e.publish(event.StatusExpired, 3))
			e.drop(2)
			return e.base.PurchaseId.String()
		}, lostVersion},
		{"duplicate terminal", func(w *world) string {
			// B expired, and a second terminal event (another MessageId) followed.
			b := w.purchases["B"]
			b.setRow(b.publish(event.StatusCancelled, 3))
			return b.base.PurchaseId.String()
		}, terminalTwice},
		{"duplicate terminal of one version", func(w *world) string {
			c := w.purchases["C"]
			c.publish(event.StatusExpired, 2)
			c.records[1], c.records[2] = c.records[2], c.records[1]
			return c.base.PurchaseId.String()
		}, terminalTwice},
		{"event without a row", func(w *world) string {
			x := w.another("X", "D", false)
			x.publish(event.StatusActive, 1)
			return x.base.PurchaseId.String()
		}, noRow},
		{"missing MessageId header", func(w *world) string {
			w.purchases["D"].records[0].messageID = ""
			return w.purchases["D"].base.PurchaseId.String()
		}, noMessageID},
		{"card off by one", func(w *world) string {
			w.cardDelta[w.objects[2].id] = 1
			return w.objects[2].id.String()
		}, cardOff},
		{"201 id with no event", func(w *world) string {
			f := w.another("F", "A", true)
			f.base.Targets = []event.Target{{TargetKind: event.TargetPost, TargetId: uuid.New()}}
			f.setRow(f.publish(event.StatusActive, 1))
			f.records = nil
			return f.base.PurchaseId.String()
		}, createdNoEvent},
		{"last record differs from the row", func(w *world) string {
			c := w.purchases["C"]
			c.row.Status = event.StatusExpired
			return c.base.PurchaseId.String()
		}, lastNotRow},
		{"malformed record not marked", func(w *world) string {
			w.malformed = map[string]bool{}
			return w.extra[0].key
		}, notAnEvent},
		{"a phantom's version published again, the phantom not known", func(w *world) string {
			clear(w.phantoms)
			return w.purchases["X"].base.PurchaseId.String()
		}, duplicateVersion},
		{"a version published twice", func(w *world) string {
			d := w.purchases["D"]
			d.publish(event.StatusActive, 1)
			return d.base.PurchaseId.String()
		}, duplicateVersion},
		{"a version past the row's", func(w *world) string {
			d := w.purchases["D"]
			d.publish(event.StatusActive, 2)
			return d.base.PurchaseId.String()
		}, unexpectedVersion},
		{"v1 not Active", func(w *world) string {
			g := w.another("G", "D", true)
			g.setRow(g.publish(event.StatusCancelled, 1))
			return g.base.PurchaseId.String()
		}, firstNotActive},
		{"an event after the terminal one", func(w *world) string {
			c := w.purchases["C"]
			c.records[0], c.records[1] = c.records[1], c.records[0]
			return c.base.PurchaseId.String()
		}, afterTerminal},
		{"versions out of offset order", func(w *world) string {
			// K: Active v2 lands before Active v1, then v2 again (the same
			// event redelivered), so that its last record is still its row.
			k := w.another("K", "D", true)
			v1 := k.publish(event.StatusActive, 1)
			k.base.BoostWeight = 8
			v2 := k.publish(event.StatusActive, 2)
			k.setRow(v2)
			k.records = []craftedRecord{v2, v1, v2}
			return k.base.PurchaseId.String()
		}, outOfOrder},
		{"one MessageId with other bytes", func(w *world) string {
			d := w.purchases["D"]
			again := d.records[0]
			d.base.BoostWeight++
			again.value = d.publish(event.StatusActive, 1).value
			d.records[len(d.records)-1] = again
			return d.base.PurchaseId.String()
		}, messageIDReused},
		{"a record keyed otherwise", func(w *world) string {
			d := w.purchases["D"]
			d.records[0].key = uuid.NewString()
			return d.base.PurchaseId.String()
		}, keyNotPurchase},
		{"201 id with no row", func(w *world) string {
			h := w.another("H", "D", true)
			h.publish(event.StatusActive, 1)
			return h.base.PurchaseId.String()
		}, createdNoRow},
		{"a phantom of a purchase a failover lost", func(w *world) string {
			l := w.another("L2", "D", true)
			l.publish(event.StatusActive, 1)
			w.lost[l.base.PurchaseId] = true
			return l.base.PurchaseId.String()
		}, noRow},
		{"a reconciled purchase that lost a version", func(w *world) string {
			w.purchases["R"].drop(2)
			return w.purchases["R"].base.PurchaseId.String()
		}, lostVersion},
		{"records removed from the topic", func(w *world) string {
			w.truncated = true
			return "starts at offset"
		}, recordsRemoved},
		{"too few boosted cards", func(w *world) string {
			for _, name := range []string{"A", "D"} {
				p := w.purchases[name]
				p.setRow(p.publish(event.StatusExpired, 2))
			}
			return "cards"
		}, tooFewBoosted},
	}
	t.Run("clean", func(t *testing.T) {
		t.Parallel()
		require.Empty(t, newWorld().check(t), "the checker reports violations in a clean world")
	})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld()
			subject := tc.brk(w)
			got := w.check(t)
			found := false
			for _, v := range got {
				found = found || (v.kind == tc.wants && strings.Contains(v.String(), subject))
			}
			require.True(t, found, "want %q about %s; the checker reported:\n%s", tc.wants, subject, list(got))
			t.Logf("reported:\n%s", list(got))
		})
	}
}

func list(vs []violation) string {
	var b strings.Builder
	for _, v := range vs {
		fmt.Fprintf(&b, "  %s\n", v)
	}
	return b.String()
}
