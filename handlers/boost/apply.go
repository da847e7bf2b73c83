// Package boost is the business rule of the Promotion Boost consumer: it keeps
// the catalog's replica of promotion contributions (one per purchase and
// target) and denormalises their sum onto project and property-object cards
// as promotion_boost. Every write joins the caller's transaction; nothing here
// begins or commits one.
package boost

import (
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"

	"github.com/promoflow/promoflow/handlers/event"
)

// ErrConflict is a transient clash with concurrent writers: a serialization
// failure, a deadlock or a lock timeout. The caller rolls back, re-reads and
// retries (seed: 3 immediate retries; the consumer's retry classes decide
// what follows, see package middleware).
var ErrConflict = errors.New("concurrent update conflict")

// Outcome is what applying one event did.
type Outcome struct {
	// PostOnly is set when the event had no Project or PropertyObject target;
	// nothing was written (Post targets belong to the news context).
	PostOnly bool
	// Stale is set when the event's Version is below the stored version of the
	// purchase's contributions; nothing was written.
	Stale bool
	// Contributions is how many contributions (one per Project/PropertyObject
	// target) the event upserted.
	Contributions int
	// CardsRecomputed is how many cards got a new promotion_boost.
	CardsRecomputed int
}

// Apply upserts the contributions of one validated event and adds the change
// of their weight to the boost of every card they address, in tx. It is
// ApplyBatch with a batch of one.
func Apply(ctx context.Context, tx *sqlx.Tx, ev event.PurchaseChanged) (Outcome, error) {
	return first(applyBatch(ctx, plain(tx), []event.PurchaseChanged{ev}))
}

// ApplyBatch applies validated events of distinct purchases together in tx and
// returns one Outcome per event, in order.
//
// A project card's boost is the sum of the active {Project, card.id}
// contributions. A property-object card's boost is the sum of the active
// {PropertyObject, card.id} contributions plus, while the card is published,
// the active {Project, card.project_id} ones: a Project target cascades to its
// project's published objects only. ApplyBatch keeps these sums by deltas: a
// contribution whose state changes adds new − old (weight while active, else
// 0) to the cards it addresses. An event is the purchase's full state: a
// stored contribution on a target it no longer names is deleted, and its
// weight taken off the cards it addressed. The deltas of the whole batch are
// summed per card and written by one statement, after the advisory locks
// (lockEvents: a savepoint and two statements) and one statement of card-row
// locks (lock.go), whatever the number of events, contributions or cards. A card that does not exist yet is
// not an error; its contribution is kept and the card's upsert sums it.
//
// Two events of one purchase must not share a batch: each is guarded against
// the purchase's stored version as it was before the batch.
func ApplyBatch(ctx context.Context, tx *sqlx.Tx, evs []event.PurchaseChanged) ([]Outcome, error) {
	return applyBatch(ctx, plain(tx), evs)
}

func applyBatch(ctx context.Context, q querier, evs []event.PurchaseChanged) ([]Outcome, error) {
	outs := make([]Outcome, len(evs))
	var in batchInput
	var l locks
	for i, ev := range evs {
		projects, objects := splitTargets(ev.Targets)
		if len(projects)+len(objects) == 0 {
			outs[i] = Outcome{PostOnly: true}
			continue
		}
		outs[i].Contributions = len(projects) + len(objects)
		in.add(i, ev, projects, objects)
		l.Purchases = append(l.Purchases, ev.PurchaseId.String())
		l.Projects, l.Objects = append(l.Projects, projects...), append(l.Objects, objects...)
	}
	if len(in.purchases) == 0 {
		return outs, nil
	}
	// Before any read; see lock.go for the order and the races it closes.
	l.Shared = true
	if err := lockEvents(ctx, q, &l); err != nil {
		return nil, err
	}
	if err := q.exec(ctx, lockCardsSQL, pq.Array(l.Projects), pq.Array(l.Objects)); err != nil {
		return nil, wrap("lock cards", err)
	}
	var res struct {
		Stored pq.Int64Array `db:"stored"`
		Cards  pq.Int64Array `db:"cards"`
	}
	if err := q.get(ctx, &res, applySQL, in.args()...); err != nil {
		return nil, wrap("apply contributions", err)
	}
	if len(res.Stored) != len(in.index) || len(res.Cards) != len(in.index) {
		return nil, fmt.Errorf("apply contributions: %d results for %d events", len(res.Stored), len(in.index))
	}
	for k, i := range in.index {
		if evs[i].Version < res.Stored[k] {
			outs[i] = Outcome{Stale: true}
			continue
		}
		outs[i].CardsRecomputed = int(res.Cards[k])
	}
	return outs, nil
}

// first is the one Outcome of a batch of one.
func first(outs []Outcome, err error) (Outcome, error) {
	if err != nil {
		return Outcome{}, err
	}
	return outs[0], nil
}

// batchInput is applySQL's arguments: one entry per event with card targets
// (index maps it back to the caller's slice) and one per target, pointing at
// its event by 1-based position.
type batchInput struct {
	index                  []int
	purchases              []string
	weights                []int64
	statuses               []string
	versions               []int64
	active                 []bool
	endsAt                 []string
	targetEvent            []int64
	targetKinds, targetIDs []string
}

func (b *batchInput) add(i int, ev event.PurchaseChanged, projects, objects []string) {
	b.index = append(b.index, i)
	b.purchases = append(b.purchases, ev.PurchaseId.String())
	b.weights = append(b.weights, int64(ev.BoostWeight))
	b.statuses = append(b.statuses, string(ev.Status))
	b.versions = append(b.versions, ev.Version)
	b.active = append(b.active, ev.Status == event.StatusActive)
	b.endsAt = append(b.endsAt, timestamptz(ev.EndsAt))
	pos := int64(len(b.index))
	add := func(kind event.TargetKind, ids []string) {
		for _, id := range ids {
			b.targetEvent = append(b.targetEvent, pos)
			b.targetKinds, b.targetIDs = append(b.targetKinds, string(kind)), append(b.targetIDs, id)
		}
	}
	add(event.TargetProject, projects)
	add(event.TargetPropertyObject, objects)
}

func (b *batchInput) args() []any {
	return []any{pq.Array(b.purchases), pq.Array(b.weights), pq.Array(b.statuses), pq.Array(b.versions),
		pq.Array(b.active), pq.Array(b.endsAt), pq.Array(b.targetEvent), pq.Array(b.targetKinds), pq.Array(b.targetIDs)}
}

// splitTargets returns the distinct Project and PropertyObject target ids as
// text (the form pq.Array sends); Post targets are dropped.
func splitTargets(targets []event.Target) (projects, objects []string) {
	seen := make(map[event.Target]bool, len(targets))
	for _, t := range targets {
		if seen[t] {
			continue
		}
		seen[t] = true
		switch t.TargetKind {
		case event.TargetProject:
			projects = append(projects, t.TargetId.String())
		case event.TargetPropertyObject:
			objects = append(objects, t.TargetId.String())
		}
	}
	return projects, objects
}

// applySQL upserts the contributions of a batch of events of distinct
// purchases ($1..$6 one entry per event; $7..$9 one per target, $7 the
// event's 1-based position) and applies their summed deltas to the cards. It
// returns, per event in order, the purchase's stored version as it was before
// (0 when none) and how many of the written cards its own deltas addressed.
//
//   - old: the purchases' contributions before the batch. The purchase locks
//     are held, so no other event changes them before "written" does
//     (a whole-projection writer in flight holds the table, and this
//     statement waits before its snapshot).
//   - written: the version guard per purchase (a stale event writes nothing)
//     and per row; a duplicate (same version and values) writes nothing.
//   - dropped: the old rows of targets that a purchase's written event no
//     longer names, deleted (snapshot semantics: the event replaces the
//     purchase's whole target set); the purchase's kept or new rows carry
//     the new version, which the version guard reads from then on.
//   - changed: new − old active weight of each written target, and − old
//     of each dropped one, zeros left out; delta sums them per target over
//     the batch, zero sums left out.
//   - projects, object_delta, objects: the writes, cards with a zero sum
//     left out. An object's delta is its own target's plus, while
//     published, its project's (reached through the project index).
//     lockCardsSQL locked every row these can write before this statement
//     took its snapshot, so no row changes under it.
//
// The statement is planned once per connection (Prepared, a generic plan):
// every table is reached through a primary key or the project index, from
// the batch's own rows, which stays the plan for any number of ids. Nothing
// here writes a card's status, visibility or prices (INV-1).
const applySQL = `WITH ev AS (
	SELECT * FROM unnest($1::uuid[], $2::integer[], $3::text[], $4::bigint[], $5::boolean[], $6::timestamptz[])
		WITH ORDINALITY AS e(purchase_id, weight, status, version, active, ends_at, i)
), old AS (
	SELECT purchase_id, target_kind, target_id, version, CASE WHEN active THEN boost_weight ELSE 0 END AS weight
	FROM catalog.promotion_contributions WHERE purchase_id = ANY($1::uuid[])
), stored AS (
	SELECT e.i, e.purchase_id, coalesce((SELECT max(o.version) FROM old o WHERE o.purchase_id = e.purchase_id), 0) AS version
	FROM ev e
), written AS (
	INSERT INTO catalog.promotion_contributions AS c
		(purchase_id, target_kind, target_id, boost_weight, status, version, active, ends_at, updated_at)
	SELECT e.purchase_id, t.kind, t.id, e.weight, e.status, e.version, e.active, e.ends_at, now()
	FROM unnest($7::bigint[], $8::text[], $9::uuid[]) AS t(i, kind, id)
		JOIN ev e ON e.i = t.i JOIN stored s ON s.i = t.i
	WHERE e.version >= s.version
	` + upsertContributionSQL + `
), dropped AS (
	DELETE FROM catalog.promotion_contributions c
	USING old o JOIN stored s ON s.purchase_id = o.purchase_id JOIN ev e ON e.i = s.i
	WHERE c.purchase_id = o.purchase_id AND c.target_kind = o.target_kind AND c.target_id = o.target_id
		AND e.version >= s.version
		AND NOT EXISTS (SELECT FROM unnest($7::bigint[], $8::text[], $9::uuid[]) AS t(i, kind, id)
			WHERE t.i = e.i AND t.kind = o.target_kind AND t.id = o.target_id)
	RETURNING c.purchase_id, c.target_kind, c.target_id, o.weight
), changed AS (
	SELECT w.purchase_id, w.target_kind AS kind, w.target_id AS id, w.weight - coalesce(o.weight, 0) AS d
	FROM written w LEFT JOIN old o
		ON o.purchase_id = w.purchase_id AND o.target_kind = w.target_kind AND o.target_id = w.target_id
	WHERE w.weight <> coalesce(o.weight, 0)
	UNION ALL
	SELECT purchase_id, target_kind, target_id, -weight FROM dropped WHERE weight <> 0
), delta AS (
	SELECT kind, id, sum(d)::integer AS d FROM changed GROUP BY kind, id HAVING sum(d) <> 0
), projects AS (
	UPDATE catalog.project_cards p SET promotion_boost = p.promotion_boost + d.d, updated_at = now()
	FROM delta d
	WHERE d.kind = 'Project' AND p.id = d.id
	RETURNING p.id
), object_delta AS (
	SELECT id, sum(d)::integer AS d FROM (
		SELECT d.id, d.d FROM delta d WHERE d.kind = 'PropertyObject'
		UNION ALL
		SELECT o.id, d.d FROM delta d JOIN catalog.property_object_cards o ON o.project_id = d.id AND o.published
		WHERE d.kind = 'Project'
	) x GROUP BY id HAVING sum(d) <> 0
), objects AS (
	UPDATE catalog.property_object_cards o SET promotion_boost = o.promotion_boost + r.d, updated_at = now()
	FROM object_delta r
	WHERE o.id = r.id
	RETURNING o.id, o.project_id, o.published
), addressed AS (
	SELECT c.purchase_id, p.id FROM changed c JOIN projects p ON c.kind = 'Project' AND p.id = c.id
	UNION ALL (
		SELECT c.purchase_id, o.id FROM changed c JOIN objects o ON c.kind = 'PropertyObject' AND o.id = c.id
		UNION
		SELECT c.purchase_id, o.id FROM changed c JOIN objects o ON c.kind = 'Project' AND o.published AND o.project_id = c.id
	)
), per_purchase AS (
	SELECT purchase_id, count(*) AS cards FROM addressed GROUP BY purchase_id
)
SELECT array_agg(s.version ORDER BY s.i) AS stored, array_agg(coalesce(pp.cards, 0) ORDER BY s.i) AS cards
FROM stored s LEFT JOIN per_purchase pp ON pp.purchase_id = s.purchase_id`

// upsertContributionSQL ends the insert of contributions (table alias c)
// with the per-row version guard: a row is replaced by a snapshot of the same
// or a newer version only, and not written at all when nothing changes. It
// returns each written row with its active weight (0 when inactive). The
// consumer's apply and a rebuild's catch-up share it, so that both keep the
// newest snapshot the same way.
const upsertContributionSQL = `ON CONFLICT (purchase_id, target_kind, target_id) DO UPDATE SET
		boost_weight = excluded.boost_weight, status = excluded.status, version = excluded.version,
		active = excluded.active, ends_at = excluded.ends_at, updated_at = excluded.updated_at
	WHERE c.version <= excluded.version
		AND (c.boost_weight, c.status, c.version, c.ends_at)
			IS DISTINCT FROM (excluded.boost_weight, excluded.status, excluded.version, excluded.ends_at)
	RETURNING c.purchase_id, c.target_kind, c.target_id, CASE WHEN c.active THEN c.boost_weight ELSE 0 END AS weight`

// wrap adds context to a database error and classifies as ErrConflict the
// errors that a rollback and an immediate retry can clear: serialization
// failures, deadlocks and a lock timeout (55P03, lock_not_available). A full
// shared lock table (53200, out of shared memory) is not a clash of writers
// but a resource of the server: it stays a plain error, which the consumer
// retries with backoff and never dead-letters.
func wrap(op string, err error) error {
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		switch pqErr.Code {
		case pqerror.TRSerializationFailure, pqerror.TRDeadlockDetected, pqerror.LockNotAvailable:
			return fmt.Errorf("%s: %w: %w", op, ErrConflict, err)
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}
