package faults

// The checker: what the fault scenarios (build tag faults) assert after each
// fault, kept free of that tag so that TestChecker_DetectsEachViolation runs
// in every go test ./... and shows that each rule can fail.
//
// It compares three sources that the product keeps apart: the purchase topic
// (what the relay published), promotion's table (what the API and the
// expirer committed) and the purchase ids the API answered 201 for. Cards are
// compared with the boost promotion's table implies.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/bounded"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// violationKind names one rule of the checker.
type violationKind string

// The checker's rules.
const (
	lostVersion       violationKind = "a version is missing from the topic"
	duplicateVersion  violationKind = "a version was published as several distinct events"
	unexpectedVersion violationKind = "an event's version is not within 1..row.Version"
	firstNotActive    violationKind = "v1 is not Active"
	terminalTwice     violationKind = "more than one terminal event"
	afterTerminal     violationKind = "an event follows a terminal one"
	outOfOrder        violationKind = "a key's versions do not appear in increasing offset order"
	messageIDReused   violationKind = "one MessageId carries different events"
	lastNotRow        violationKind = "the last record of the key differs from the row"
	noRow             violationKind = "an event whose purchase has no row"
	noMessageID       violationKind = "a record without a MessageId header"
	notAnEvent        violationKind = "a record that is not a valid event"
	keyNotPurchase    violationKind = "a record whose key is not its PurchaseId"
	createdNoEvent    violationKind = "a purchase answered 201 has no event on the topic"
	createdNoRow      violationKind = "a purchase answered 201 has no row"
	recordsRemoved    violationKind = "records were removed from the topic"
	cardOff           violationKind = "a card's boost differs from promotion's truth"
	tooFewBoosted     violationKind = "too few cards have a non-zero true boost"
)

// violation is one broken rule, about one purchase, card, record or topic.
type violation struct {
	kind    violationKind
	subject string
	detail  string
}

func (v violation) String() string {
	if v.detail == "" {
		return fmt.Sprintf("%s: %s", v.subject, v.kind)
	}
	return fmt.Sprintf("%s: %s (%s)", v.subject, v.kind, v.detail)
}

// topicRecord is one record of the purchase topic.
type topicRecord struct {
	Partition int32
	Offset    int64
	Key       string
	// MessageID is the Watermill message UUID header, "" when it is missing.
	MessageID string
	Value     []byte
	// Timestamp is the record's, the relay's produce time.
	Timestamp time.Time
}

func (r topicRecord) where() string { return fmt.Sprintf("record %d/%d", r.Partition, r.Offset) }

// purchaseRow is a row of promotion.promotion_purchases, read column by
// column: the checker builds the event a row implies by itself, not with the
// product's mapping it checks.
type purchaseRow struct {
	ID            uuid.UUID    `db:"id"`
	TenantID      uuid.UUID    `db:"tenant_id"`
	PackageKind   string       `db:"package_kind"`
	Targets       []byte       `db:"targets"`
	BoostWeight   int          `db:"boost_weight"`
	Status        event.Status `db:"status"`
	PaymentStatus string       `db:"payment_status"`
	StartsAt      time.Time    `db:"starts_at"`
	EndsAt        time.Time    `db:"ends_at"`
	Version       int64        `db:"version"`
}

// event is the state the row says its last event carries.
func (r purchaseRow) event() (event.PurchaseChanged, error) {
	var targets []event.Target
	if err := json.Unmarshal(r.Targets, &targets); err != nil {
		return event.PurchaseChanged{}, fmt.Errorf("targets of %s: %w", r.ID, err)
	}
	return event.PurchaseChanged{PurchaseId: r.ID, TenantId: r.TenantID, PackageKind: r.PackageKind, Targets: targets,
		BoostWeight: r.BoostWeight, Status: r.Status, PaymentStatus: r.PaymentStatus,
		StartsAt: r.StartsAt.UTC(), EndsAt: r.EndsAt.UTC(), Version: r.Version}, nil
}

// evidence is what the checker compares.
type evidence struct {
	// removed names partitions whose oldest offset is above 0.
	removed []string
	records []topicRecord
	rows    []purchaseRow
	// created are the ids the API answered 201 for.
	created map[uuid.UUID]bool
	// malformed are the keys of records a scenario wrote to break the
	// contract on purpose; only those records are left out.
	malformed map[string]bool
	// lost are ids answered 201 by a primary that failed over before its
	// asynchronous standby had them: neither a row nor an event is owed.
	lost map[uuid.UUID]bool
	// reconciled are purchases `promoflow reconcile` wrote again after a
	// failover: a phantom's terminal event may precede the database's truth.
	reconciled map[uuid.UUID]bool
	// phantoms are the MessageIds of records published by a primary while
	// its asynchronous standby was cut off, before that standby was
	// promoted: the promoted database may lack their changes, and publish
	// those versions again as events of its own. Such a record does not
	// count as a version published twice, as out of order or as a terminal
	// event; every rule still holds among the other records.
	phantoms map[string]bool
}

// parsed is a record that holds a valid event.
type parsed struct {
	rec topicRecord
	ev  event.PurchaseChanged
	id  string // MessageId, or the record's position when it has none
}

// violations applies every rule of the topic against the table:
//   - every record not marked malformed is a valid event with a MessageId,
//     keyed by its PurchaseId, and its purchase has a row;
//   - a purchase's versions are exactly 1..row.Version, each once as a
//     distinct MessageId (a redelivery of one MessageId is one event), v1 is
//     Active, at most one event is terminal and none follows it;
//   - a key's versions first appear in increasing offset order (two relays
//     publishing at once can land an older version after a newer one);
//   - the last record of the purchase's key equals the row;
//   - every id answered 201 has a row and an event.
func (ev evidence) violations() []violation {
	var out []violation
	bad := func(kind violationKind, subject, format string, args ...any) {
		out = append(out, violation{kind: kind, subject: subject, detail: fmt.Sprintf(format, args...)})
	}
	for _, p := range ev.removed {
		bad(recordsRemoved, p, "the checker cannot see the whole topic")
	}
	records := slices.Clone(ev.records)
	sort.Slice(records, func(i, j int) bool {
		a, b := records[i], records[j]
		return a.Partition < b.Partition || (a.Partition == b.Partition && a.Offset < b.Offset)
	})
	events := map[uuid.UUID][]parsed{}
	lastOfKey := map[string]parsed{}
	for _, rec := range records {
		if ev.malformed[rec.Key] {
			continue
		}
		id := rec.MessageID
		if id == "" {
			bad(noMessageID, rec.where(), "key %s", rec.Key)
			id = rec.where()
		}
		e, err := event.Parse(rec.Value)
		if err != nil {
			bad(notAnEvent, rec.where(), "key %s: %v", rec.Key, err)
			continue
		}
		if rec.Key != e.PurchaseId.String() {
			bad(keyNotPurchase, rec.where(), "key %q, PurchaseId %s", rec.Key, e.PurchaseId)
		}
		p := parsed{rec: rec, ev: e, id: id}
		events[e.PurchaseId] = append(events[e.PurchaseId], p)
		lastOfKey[rec.Key] = p
	}
	rows := make(map[uuid.UUID]purchaseRow, len(ev.rows))
	for _, r := range ev.rows {
		rows[r.ID] = r
	}
	for id, ps := range events {
		if _, ok := rows[id]; !ok {
			bad(noRow, "purchase "+id.String(), "%d records, first %s", len(ps), ps[0].rec.where())
		}
	}
	for _, row := range ev.rows {
		out = append(out, checkPurchase(row, events[row.ID], lastOfKey, ev.reconciled[row.ID], ev.phantoms)...)
	}
	for id := range ev.created {
		if ev.lost[id] {
			continue
		}
		subject := "purchase " + id.String()
		if _, ok := rows[id]; !ok {
			bad(createdNoRow, subject, "")
		}
		if len(events[id]) == 0 {
			bad(createdNoEvent, subject, "")
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// checkPurchase applies the per-purchase rules to one row and its events, in
// offset order; of a reconciled purchase, the terminal rules are left out,
// and phantoms (evidence.phantoms) are left out of the rules on order,
// duplicates and terminal events.
func checkPurchase(row purchaseRow, ps []parsed, lastOfKey map[string]parsed, reconciled bool, phantoms map[string]bool) []violation {
	var out []violation
	subject := fmt.Sprintf("purchase %s (%s v%d)", row.ID, row.Status, row.Version)
	bad := func(kind violationKind, format string, args ...any) {
		out = append(out, violation{kind: kind, subject: subject, detail: fmt.Sprintf(format, args...)})
	}
	// Distinct events: a MessageId seen again is a redelivery, and must
	// carry the same bytes.
	first := map[string]parsed{}
	var distinct []parsed
	for _, p := range ps {
		if prev, ok := first[p.id]; ok {
			if !bytes.Equal(prev.rec.Value, p.rec.Value) {
				bad(messageIDReused, "MessageId %s at %s and %s", p.id, prev.rec.where(), p.rec.where())
			}
			continue
		}
		first[p.id] = p
		distinct = append(distinct, p)
	}
	for i := 1; i < len(distinct); i++ {
		if prev, p := distinct[i-1], distinct[i]; p.ev.Version < prev.ev.Version && !phantoms[prev.id] {
			bad(outOfOrder, "v%d at %s first appears after v%d at %s", p.ev.Version, p.rec.where(),
				prev.ev.Version, prev.rec.where())
		}
	}
	byVersion := map[int64][]parsed{}
	terminal := 0
	for i, p := range distinct {
		v := p.ev.Version
		byVersion[v] = append(byVersion[v], p)
		if v > row.Version {
			bad(unexpectedVersion, "v%d at %s", v, p.rec.where())
		}
		if v == 1 && p.ev.Status != event.StatusActive {
			bad(firstNotActive, "v1 is %s at %s", p.ev.Status, p.rec.where())
		}
		if p.ev.Status.Terminal() && !phantoms[p.id] {
			terminal++
			if i < len(distinct)-1 && !reconciled {
				bad(afterTerminal, "%s v%d at %s is followed by v%d at %s", p.ev.Status, v, p.rec.where(),
					distinct[i+1].ev.Version, distinct[i+1].rec.where())
			}
		}
	}
	if terminal > 1 && !reconciled {
		bad(terminalTwice, "%d terminal events", terminal)
	}
	for v := int64(1); v <= row.Version; v++ {
		got := byVersion[v]
		if real := slices.DeleteFunc(slices.Clone(got), func(p parsed) bool { return phantoms[p.id] }); len(real) > 0 {
			got = real // a phantom and the promoted database's own event
		}
		switch {
		case len(got) == 0:
			bad(lostVersion, "v%d", v)
		case len(got) > 1:
			where := make([]string, len(got))
			for i, p := range got {
				where[i] = fmt.Sprintf("%s %s (MessageId %s)", p.ev.Status, p.rec.where(), p.id)
			}
			bad(duplicateVersion, "v%d: %v", v, where)
		}
	}
	last, ok := lastOfKey[row.ID.String()]
	if !ok {
		return out
	}
	want, err := row.event()
	if err != nil {
		bad(lastNotRow, "%v", err)
	} else if !sameState(last.ev, want) {
		bad(lastNotRow, "%s: %s, row: %s", last.rec.where(), describe(last.ev), describe(want))
	}
	return out
}

// sameState compares every field of two events.
func sameState(a, b event.PurchaseChanged) bool {
	return a.PurchaseId == b.PurchaseId && a.TenantId == b.TenantId && a.PackageKind == b.PackageKind &&
		slices.Equal(a.Targets, b.Targets) && a.BoostWeight == b.BoostWeight && a.Status == b.Status &&
		a.PaymentStatus == b.PaymentStatus && a.StartsAt.Equal(b.StartsAt) && a.EndsAt.Equal(b.EndsAt) &&
		a.Version == b.Version
}

func describe(e event.PurchaseChanged) string {
	return fmt.Sprintf("%s v%d weight %d targets %d payment %s %s..%s tenant %s", e.Status, e.Version, e.BoostWeight,
		len(e.Targets), e.PaymentStatus, e.StartsAt.UTC().Format("15:04:05.000000"), e.EndsAt.UTC().Format("15:04:05.000000"), e.TenantId)
}

// readTopic reads every record of topic up to its end now.
func readTopic(ctx context.Context, cluster kafkakit.Cluster, topic string) (removed []string, records []topicRecord, err error) {
	client, err := bounded.Dial(cluster, "promoflow-faults-checker")
	if err != nil {
		return nil, nil, err
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, nil, err
	}
	ranges := make([]bounded.Range, len(parts))
	for i, p := range parts {
		ranges[i] = p.Whole()
		if p.Oldest > 0 {
			removed = append(removed, fmt.Sprintf("partition %s/%d starts at offset %d", topic, p.Partition, p.Oldest))
		}
	}
	var mu sync.Mutex
	err = client.Read(ctx, ranges, func(_ context.Context, rec *sarama.ConsumerMessage) error {
		r := topicRecord{Partition: rec.Partition, Offset: rec.Offset, Key: string(rec.Key), Value: rec.Value, Timestamp: rec.Timestamp}
		for _, h := range rec.Headers {
			if string(h.Key) == kafka.UUIDHeaderKey {
				r.MessageID = string(h.Value)
			}
		}
		mu.Lock()
		records = append(records, r)
		mu.Unlock()
		return nil
	}, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", topic, err)
	}
	return removed, records, nil
}

// readPurchases reads promotion's table.
func readPurchases(ctx context.Context, db *sqlx.DB) ([]purchaseRow, error) {
	var rows []purchaseRow
	if err := db.SelectContext(ctx, &rows, `SELECT id, tenant_id, package_kind, targets, boost_weight, status,
		payment_status, starts_at, ends_at, version FROM promotion.promotion_purchases`); err != nil {
		return nil, fmt.Errorf("read purchases: %w", err)
	}
	return rows, nil
}

// cardTruth is a card's boost and the boost promotion's table implies: the
// sum of the weights of the Active purchases that target it (a published
// object gets its project's too).
type cardTruth struct {
	Kind string    `db:"kind"`
	ID   uuid.UUID `db:"id"`
	Have int       `db:"have"`
	Want int       `db:"want"`
}

const cardTruthSQL = `WITH active AS (
	SELECT p.boost_weight AS w, t->>'TargetKind' AS kind, (t->>'TargetId')::uuid AS id
	FROM promotion.promotion_purchases p, jsonb_array_elements(p.targets) t WHERE p.status = 'Active'
), sums AS (SELECT kind, id, sum(w)::int AS s FROM active GROUP BY kind, id)
SELECT 'Project' AS kind, c.id, c.promotion_boost AS have, coalesce(s.s, 0) AS want
FROM catalog.project_cards c LEFT JOIN sums s ON s.kind = 'Project' AND s.id = c.id
UNION ALL
SELECT 'PropertyObject', o.id, o.promotion_boost,
	coalesce(own.s, 0) + CASE WHEN o.published THEN coalesce(pr.s, 0) ELSE 0 END
FROM catalog.property_object_cards o
LEFT JOIN sums own ON own.kind = 'PropertyObject' AND own.id = o.id
LEFT JOIN sums pr ON pr.kind = 'Project' AND pr.id = o.project_id`

// readCards reads every card with its true boost.
func readCards(ctx context.Context, db *sqlx.DB) ([]cardTruth, error) {
	var cards []cardTruth
	if err := db.SelectContext(ctx, &cards, cardTruthSQL); err != nil {
		return nil, fmt.Errorf("read cards and their truth: %w", err)
	}
	return cards, nil
}

// minBoostedShare is the share of cards whose true boost must be non-zero:
// a card check against zeros cannot tell a lost Active event from its
// terminal one.
const minBoostedShare = 0.5

// checkCards wants every card's boost to be its truth, and at least
// minBoostedShare of the cards to have a non-zero truth.
func checkCards(cards []cardTruth) []violation {
	var out []violation
	boosted := 0
	for _, c := range cards {
		if c.Want != 0 {
			boosted++
		}
		if c.Have != c.Want {
			out = append(out, violation{kind: cardOff, subject: fmt.Sprintf("%s card %s", c.Kind, c.ID),
				detail: fmt.Sprintf("boost %d, truth %d", c.Have, c.Want)})
		}
	}
	if need := int(float64(len(cards))*minBoostedShare + 0.5); boosted < need || boosted == 0 {
		out = append(out, violation{kind: tooFewBoosted, subject: "cards",
			detail: fmt.Sprintf("%d of %d have a non-zero true boost, want at least %d", boosted, len(cards), need)})
	}
	return out
}
