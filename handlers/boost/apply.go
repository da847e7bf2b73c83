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

// Apply upserts the contributions of one validated event and recomputes the
// boost of every card they address, in tx.
//
// A project card's boost is the sum of the active {Project, card.id}
// contributions. A property-object card's boost is the sum of the active
// {PropertyObject, card.id} contributions plus, while the card is published,
// the active {Project, card.project_id} ones: a Project target cascades to its
// project's published objects only. A card that does not exist yet is not an
// error; its contribution is kept and the card's upsert picks it up.
func Apply(ctx context.Context, tx *sqlx.Tx, ev event.PurchaseChanged) (Outcome, error) {
	projects, objects := splitTargets(ev.Targets)
	if len(projects)+len(objects) == 0 {
		return Outcome{PostOnly: true}, nil
	}

	// Locks before any read: the purchase (serialises its own events, e.g. a
	// replay racing the live consumer), then every card whose sum this event
	// changes, so that a concurrent event or card upsert on the same card
	// either commits before our sums are read or waits for our commit.
	purchase := []string{ev.PurchaseId.String()}
	if len(projects) == 0 {
		if err := lock(ctx, tx, purchase, nil, objects, nil); err != nil {
			return Outcome{}, err
		}
	} else {
		if err := lock(ctx, tx, purchase, projects, nil, nil); err != nil {
			return Outcome{}, err
		}
		// Read the cascade only once the projects are held: a card upsert
		// locks its project first, so the set of published objects cannot
		// change under us from here on.
		if err := lock(ctx, tx, nil, nil, objects, projects); err != nil {
			return Outcome{}, err
		}
	}

	stored, err := upsertContributions(ctx, tx, ev, projects, objects)
	if err != nil {
		return Outcome{}, err
	}
	if ev.Version < stored {
		return Outcome{Stale: true}, nil
	}
	n, err := recompute(ctx, tx, projects, objects)
	if err != nil {
		return Outcome{}, err
	}
	return Outcome{Contributions: len(projects) + len(objects), CardsRecomputed: n}, nil
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

// upsertContributions writes one contribution per target unless the event is
// stale, and returns the purchase's stored version as it was before (0 when
// none). One statement: the guard and the upsert see the same snapshot, taken
// after the purchase lock.
func upsertContributions(ctx context.Context, tx *sqlx.Tx, ev event.PurchaseChanged, projects, objects []string) (int64, error) {
	kinds := make([]string, 0, len(projects)+len(objects))
	ids := make([]string, 0, len(projects)+len(objects))
	for _, id := range projects {
		kinds, ids = append(kinds, string(event.TargetProject)), append(ids, id)
	}
	for _, id := range objects {
		kinds, ids = append(kinds, string(event.TargetPropertyObject)), append(ids, id)
	}
	var stored int64
	err := tx.GetContext(ctx, &stored, `WITH stored AS (
			SELECT coalesce(max(version), 0) AS version
			FROM catalog.promotion_contributions WHERE purchase_id = $1::uuid
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
		)
		SELECT version FROM stored`,
		ev.PurchaseId, pq.Array(kinds), pq.Array(ids), ev.BoostWeight, string(ev.Status), ev.Version,
		ev.Status == event.StatusActive, ev.EndsAt)
	if err != nil {
		return 0, wrap("upsert contributions", err)
	}
	return stored, nil
}

// recompute sets the boost of the project cards in projects and of the
// property-object cards in objects or published under projects, writing only
// the cards whose value changed, and returns how many it wrote. It must run
// after the locks: its snapshot then holds every committed contribution.
func recompute(ctx context.Context, tx *sqlx.Tx, projects, objects []string) (int, error) {
	var n int
	err := tx.GetContext(ctx, &n, recomputeSQL, pq.Array(projects), pq.Array(objects))
	if err != nil {
		return 0, wrap("recompute cards", err)
	}
	return n, nil
}

// recomputeSQL is the set-based form of projectBoost and objectBoost for
// project ids $1 and property-object ids $2: each target's sum is read once,
// however many cards share it (a project's sum feeds all of its published
// objects).
const recomputeSQL = `WITH objs AS (
	SELECT id, project_id, published FROM catalog.property_object_cards
	WHERE id = ANY($2::uuid[]) OR (published AND project_id = ANY($1::uuid[]))
), sums AS (
	SELECT c.target_kind, c.target_id, sum(c.boost_weight)::integer AS boost
	FROM catalog.promotion_contributions c
	JOIN (SELECT 'Project' AS kind, id FROM unnest($1::uuid[]) AS id
		UNION SELECT 'Project', project_id FROM objs WHERE published
		UNION SELECT 'PropertyObject', id FROM objs) t
		ON c.target_kind = t.kind AND c.target_id = t.id
	WHERE c.active
	GROUP BY c.target_kind, c.target_id
), projects AS (
	UPDATE catalog.project_cards p SET promotion_boost = coalesce(s.boost, 0), updated_at = now()
	FROM unnest($1::uuid[]) AS t(id)
	LEFT JOIN sums s ON s.target_kind = 'Project' AND s.target_id = t.id
	WHERE p.id = t.id AND p.promotion_boost <> coalesce(s.boost, 0)
	RETURNING 1
), objects AS (
	UPDATE catalog.property_object_cards o SET promotion_boost = b.boost, updated_at = now()
	FROM (SELECT objs.id,
			coalesce(own.boost, 0) + CASE WHEN objs.published THEN coalesce(project.boost, 0) ELSE 0 END AS boost
		FROM objs
		LEFT JOIN sums own ON own.target_kind = 'PropertyObject' AND own.target_id = objs.id
		LEFT JOIN sums project ON project.target_kind = 'Project' AND project.target_id = objs.project_id) b
	WHERE o.id = b.id AND o.promotion_boost <> b.boost
	RETURNING 1
)
SELECT (SELECT count(*) FROM projects) + (SELECT count(*) FROM objects)`

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
