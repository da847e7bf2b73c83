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
// failure, a deadlock, a lock timeout or a full lock table. The caller rolls
// back, re-reads and retries (seed: 3 immediate retries, then the DLQ, from
// which a replay is safe).
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
// of their weight to the boost of every card they address, in tx.
//
// A project card's boost is the sum of the active {Project, card.id}
// contributions. A property-object card's boost is the sum of the active
// {PropertyObject, card.id} contributions plus, while the card is published,
// the active {Project, card.project_id} ones: a Project target cascades to its
// project's published objects only. Apply keeps these sums by deltas: a
// contribution whose state changes adds new − old (weight while active, else
// 0) to the cards it addresses: one statement after the target locks,
// whatever the number of contributions behind a card. A card that does not
// exist yet is not an error; its contribution is kept and the card's upsert
// sums it.
func Apply(ctx context.Context, tx *sqlx.Tx, ev event.PurchaseChanged) (Outcome, error) {
	return apply(ctx, plain(tx), ev)
}

func apply(ctx context.Context, q querier, ev event.PurchaseChanged) (Outcome, error) {
	projects, objects := splitTargets(ev.Targets)
	if len(projects)+len(objects) == 0 {
		return Outcome{PostOnly: true}, nil
	}
	// Before any read; see lock.go for the order and the races it closes.
	err := lock(ctx, q, locks{Purchase: ev.PurchaseId.String(), Projects: projects, Objects: objects, Shared: true})
	if err != nil {
		return Outcome{}, err
	}

	kinds := make([]string, 0, len(projects)+len(objects))
	ids := make([]string, 0, len(projects)+len(objects))
	for _, id := range projects {
		kinds, ids = append(kinds, string(event.TargetProject)), append(ids, id)
	}
	for _, id := range objects {
		kinds, ids = append(kinds, string(event.TargetPropertyObject)), append(ids, id)
	}
	var res struct {
		Stored int64 `db:"stored"`
		Cards  int   `db:"cards"`
	}
	err = q.get(ctx, &res, applySQL, ev.PurchaseId, pq.Array(kinds), pq.Array(ids), ev.BoostWeight,
		string(ev.Status), ev.Version, ev.Status == event.StatusActive, ev.EndsAt)
	if err != nil {
		return Outcome{}, wrap("apply contributions", err)
	}
	if ev.Version < res.Stored {
		return Outcome{Stale: true}, nil
	}
	return Outcome{Contributions: len(projects) + len(objects), CardsRecomputed: res.Cards}, nil
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

// applySQL upserts the contributions of purchase $1 (targets $2 kinds, $3
// ids) and applies their deltas to the cards, and returns the purchase's
// stored version as it was before (0 when none) and how many cards it wrote.
//
//   - old: the purchase's contributions before the event. The purchase lock
//     is held, so no other event changes them before "written" does (ResetTx
//     holds the table, and this statement waits before its snapshot).
//   - written: the version guard per purchase (a stale event writes nothing)
//     and per row; a duplicate (same version and values) writes nothing.
//   - delta: new − old active weight of each written target, zeros left out.
//   - project_rows, object_rows: the cards to change, locked in id order
//     (lock.go), project cards first (object_rows waits for "projects"). An
//     object's delta is its own target's plus, while published, its
//     project's. FOR NO KEY UPDATE re-reads a row that a card upsert changed
//     after this statement's snapshot, with its new project_id and published.
//   - projects, objects: the writes, cards with a zero delta left out. The
//     "= ANY(array)" conditions let both reads and writes use the indexes
//     (primary keys and the project index).
//
// Nothing here writes a card's status, visibility or prices (INV-1).
const applySQL = `WITH old AS (
	SELECT target_kind, target_id, version, CASE WHEN active THEN boost_weight ELSE 0 END AS weight
	FROM catalog.promotion_contributions WHERE purchase_id = $1::uuid
), stored AS (
	SELECT coalesce(max(version), 0) AS version FROM old
), written AS (
	INSERT INTO catalog.promotion_contributions AS c
		(purchase_id, target_kind, target_id, boost_weight, status, version, active, ends_at, updated_at)
	SELECT $1::uuid, t.kind, t.id, $4::integer, $5::text, $6::bigint, $7::boolean, $8::timestamptz, now()
	FROM unnest($2::text[], $3::uuid[]) AS t(kind, id), stored
	WHERE $6::bigint >= stored.version
	ON CONFLICT (purchase_id, target_kind, target_id) DO UPDATE SET
		boost_weight = excluded.boost_weight, status = excluded.status, version = excluded.version,
		active = excluded.active, ends_at = excluded.ends_at, updated_at = excluded.updated_at
	WHERE c.version <= excluded.version
		AND (c.boost_weight, c.status, c.version, c.ends_at)
			IS DISTINCT FROM (excluded.boost_weight, excluded.status, excluded.version, excluded.ends_at)
	RETURNING c.target_kind, c.target_id, CASE WHEN c.active THEN c.boost_weight ELSE 0 END AS weight
), delta AS (
	SELECT w.target_kind AS kind, w.target_id AS id, w.weight - coalesce(o.weight, 0) AS d
	FROM written w LEFT JOIN old o ON o.target_kind = w.target_kind AND o.target_id = w.target_id
	WHERE w.weight <> coalesce(o.weight, 0)
), targets AS (
	SELECT array_agg(id) FILTER (WHERE kind = 'Project') AS projects,
		array_agg(id) FILTER (WHERE kind = 'PropertyObject') AS objects
	FROM delta
), project_rows AS (
	SELECT p.id, (SELECT d FROM delta WHERE kind = 'Project' AND id = p.id) AS d
	FROM catalog.project_cards p
	WHERE p.id = ANY((SELECT projects FROM targets)::uuid[])
	ORDER BY p.id FOR NO KEY UPDATE
), projects AS (
	UPDATE catalog.project_cards p SET promotion_boost = p.promotion_boost + r.d, updated_at = now()
	FROM project_rows r
	WHERE p.id = ANY((SELECT projects FROM targets)::uuid[]) AND p.id = r.id
	RETURNING 1
), object_rows AS (
	SELECT o.id, coalesce((SELECT d FROM delta WHERE kind = 'PropertyObject' AND id = o.id), 0)
		+ CASE WHEN o.published
			THEN coalesce((SELECT d FROM delta WHERE kind = 'Project' AND id = o.project_id), 0)
			ELSE 0 END AS d
	FROM catalog.property_object_cards o
	WHERE (SELECT count(*) FROM projects) >= 0
		AND (o.id = ANY((SELECT objects FROM targets)::uuid[])
			OR (o.published AND o.project_id = ANY((SELECT projects FROM targets)::uuid[])))
	ORDER BY o.id FOR NO KEY UPDATE
), objects AS (
	UPDATE catalog.property_object_cards o SET promotion_boost = o.promotion_boost + r.d, updated_at = now()
	FROM object_rows r
	WHERE (o.id = ANY((SELECT objects FROM targets)::uuid[])
			OR (o.published AND o.project_id = ANY((SELECT projects FROM targets)::uuid[])))
		AND o.id = r.id AND r.d <> 0
	RETURNING 1
)
SELECT (SELECT version FROM stored) AS stored,
	(SELECT count(*) FROM projects) + (SELECT count(*) FROM objects) AS cards`

// wrap adds context to a database error and classifies as ErrConflict the
// errors that a rollback and an immediate retry can clear: serialization
// failures, deadlocks, a lock timeout (55P03, lock_not_available) and a full
// shared lock table (53200, out of shared memory).
func wrap(op string, err error) error {
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		switch pqErr.Code {
		case pqerror.TRSerializationFailure, pqerror.TRDeadlockDetected, pqerror.LockNotAvailable, pqerror.OutOfMemory:
			return fmt.Errorf("%s: %w: %w", op, ErrConflict, err)
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}
