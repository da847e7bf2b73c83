package boost

import (
	"context"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/promoflow/promoflow/handlers/event"
)

// The seed's formula, computed from the replica. Apply keeps every card equal
// to it by deltas; the card upserts compute it for the one card they write,
// and Drift and RecomputeAllTx compare and repair every card against it. A
// rebuild computes it from the sums of the projection it built beside the
// live one (Build.SwitchTx).

// sums is where the formula reads the SQL sum of the active contributions of
// one target.
type sums func(kind event.TargetKind, id string) string

// replicaSums sums the replica's active contributions of the target.
func replicaSums(kind event.TargetKind, id string) string {
	return `(SELECT coalesce(sum(c.boost_weight), 0)::integer FROM catalog.promotion_contributions c
		WHERE c.active AND c.target_kind = '` + string(kind) + `' AND c.target_id = ` + id + `)`
}

// joinedSums reads the sums that cardDriftSQL joins to each card from a
// table of sums by target, one join per kind (alias s_<kind>, on the id the
// formula names); a target the table does not name sums to 0.
func joinedSums(kind event.TargetKind, _ string) string {
	return `coalesce(s_` + string(kind) + `.weight, 0)`
}

// joinSums is the join of table's sum of the kind's target id to a card.
func joinSums(table string, kind event.TargetKind, id string) string {
	alias := `s_` + string(kind)
	return ` LEFT JOIN ` + table + ` ` + alias + ` ON ` + alias + `.target_kind = '` + string(kind) +
		`' AND ` + alias + `.target_id = ` + id
}

// projectBoost is the SQL boost of the project card with the given id.
func projectBoost(sum sums, id string) string { return sum(event.TargetProject, id) }

// objectBoost is the SQL boost of a property-object card. The project part
// counts only while the card is published, so that the value is a function of
// the replica and the card alone: the cascade never reaches an unpublished
// card, and a replay after a rebuild must reproduce every card.
func objectBoost(sum sums, id, projectID, published string) string {
	return `(` + sum(event.TargetPropertyObject, id) + ` + CASE WHEN ` + published + ` THEN ` +
		sum(event.TargetProject, projectID) + ` ELSE 0 END)`
}

// lockProjectionSQL holds back every writer of boosts (events, card upserts,
// repairs) until the transaction ends, and waits for those in flight, so that
// a write of the whole projection has none half on each side of it. EXCLUSIVE
// lets reads through. The tables are taken in the global lock order (lock.go):
// the card tables first, then the contributions. A live batch holds both card
// tables (lockCardsSQL) before it touches the contributions, so this statement
// waits for it at the card tables while holding nothing the batch still needs;
// taking the contributions first would hold what the batch's apply waits for,
// while waiting for the batch's card tables: a deadlock.
const lockProjectionSQL = `LOCK TABLE catalog.project_cards, catalog.property_object_cards,
	catalog.promotion_contributions IN EXCLUSIVE MODE`

// CardDrift is a card whose stored boost differs from the replica's sum.
type CardDrift struct {
	// Kind is Project for a project card, PropertyObject for an object card.
	Kind   event.TargetKind `db:"kind"`
	ID     uuid.UUID        `db:"id"`
	Stored int              `db:"stored"`
	Want   int              `db:"want"`
}

// cardDriftSQL lists the cards whose boost is not the formula's over table,
// a table of sums by target (target_kind, target_id, weight). The sums are
// joined to the cards, so that the check is one pass over each side whatever
// their sizes.
func cardDriftSQL(table string) string {
	return `SELECT kind, id, stored, want FROM (
	SELECT 'Project' AS kind, id, promotion_boost AS stored, ` + projectBoost(joinedSums, "id") + ` AS want
	FROM catalog.project_cards` + joinSums(table, event.TargetProject, "id") + `
	UNION ALL
	SELECT 'PropertyObject', id, promotion_boost, ` + objectBoost(joinedSums, "id", "project_id", "published") + `
	FROM catalog.property_object_cards` + joinSums(table, event.TargetPropertyObject, "id") +
		joinSums(table, event.TargetProject, "project_id") + `
) cards WHERE stored <> want`
}

// replicaTotals is the replica's sum of active contributions per target, in
// one grouped pass over the active rows' index, as the common table
// expression "totals". A check of every card reads its sums from it: the
// per-card sums of replicaSums would read a project's contributions once for
// each of its objects.
const replicaTotals = `totals AS MATERIALIZED (SELECT target_kind, target_id, sum(boost_weight)::integer AS weight
	FROM catalog.promotion_contributions WHERE active GROUP BY target_kind, target_id)`

// driftSQL lists the cards whose boost is not the replica's formula.
var driftSQL = `WITH ` + replicaTotals + ` ` + cardDriftSQL("totals")

// recomputeCardsSQL sets every card whose boost is not the formula's over
// table (cardDriftSQL) to the formula's value and counts them; ctes, when not
// empty, are common table expressions before it, each followed by a comma.
// Only promotion_boost is written (INV-1).
func recomputeCardsSQL(ctes, table string) string {
	return `WITH ` + ctes + ` drift AS (` + cardDriftSQL(table) + `), projects AS (
			UPDATE catalog.project_cards p SET promotion_boost = d.want, updated_at = now()
			FROM drift d WHERE d.kind = 'Project' AND p.id = d.id
			RETURNING 1
		), objects AS (
			UPDATE catalog.property_object_cards o SET promotion_boost = d.want, updated_at = now()
			FROM drift d WHERE d.kind = 'PropertyObject' AND o.id = d.id
			RETURNING 1
		)
		SELECT (SELECT count(*) FROM projects) + (SELECT count(*) FROM objects)`
}

// recomputeAllSQL sets every drifted card to the replica's formula.
var recomputeAllSQL = recomputeCardsSQL(replicaTotals+`,`, "totals")

// Drift lists the cards whose boost differs from the replica's sum, for an
// audit of the deltas. It needs no lock: every committed write keeps the cards
// equal to the sums, so one statement's snapshot shows drift only where the
// data has drifted.
func Drift(ctx context.Context, q sqlx.QueryerContext) ([]CardDrift, error) {
	var out []CardDrift
	if err := sqlx.SelectContext(ctx, q, &out, driftSQL+` ORDER BY kind, id`); err != nil {
		return nil, fmt.Errorf("audit card boosts: %w", err)
	}
	return out, nil
}

// RecomputeAllTx sets the boost of every card that drifted to the replica's
// sum, in tx, and returns how many cards it changed (0: no drift). It holds
// back events and card upserts until tx ends. Only promotion_boost is written
// (INV-1).
func RecomputeAllTx(ctx context.Context, tx *sqlx.Tx) (int, error) {
	if _, err := tx.ExecContext(ctx, lockProjectionSQL); err != nil {
		return 0, wrap("lock projection", err)
	}
	var n int
	if err := tx.GetContext(ctx, &n, recomputeAllSQL); err != nil {
		return 0, wrap("recompute cards", err)
	}
	return n, nil
}

// RepairTx recomputes the given cards from the replica, in tx, under the
// locks a card upsert takes: their targets exclusive, an object card's
// project included (its boost holds the project's sum). A live event on those
// targets commits before or waits, so a repair is safe while the consumer
// runs. It writes only cards that still differ and returns how many it changed.
// A card whose project moved while the locks were taken is an ErrConflict:
// run the repair again.
func RepairTx(ctx context.Context, tx *sqlx.Tx, cards []CardDrift) (int, error) {
	var projects, objects []string
	for _, c := range cards {
		if c.Kind == event.TargetProject {
			projects = append(projects, c.ID.String())
		} else {
			objects = append(objects, c.ID.String())
		}
	}
	homes := func() ([]string, error) {
		var ids []string
		err := tx.SelectContext(ctx, &ids, `SELECT DISTINCT project_id::text FROM catalog.property_object_cards
			WHERE id = ANY($1::uuid[]) ORDER BY 1`, pq.Array(objects))
		return ids, err
	}
	before, err := homes()
	if err != nil {
		return 0, wrap("read card projects", err)
	}
	if err := lock(ctx, plain(tx), locks{Projects: append(projects, before...), Objects: objects}); err != nil {
		return 0, err
	}
	// Only an upsert moves an object, and it needs the object's lock, which
	// is held now: the projects can have changed only before it was taken.
	after, err := homes()
	if err != nil {
		return 0, wrap("read card projects", err)
	}
	if !slices.Equal(before, after) {
		return 0, fmt.Errorf("repair cards: a card moved to another project meanwhile: %w", ErrConflict)
	}
	var n int
	err = tx.GetContext(ctx, &n, `WITH projects AS (
			UPDATE catalog.project_cards SET promotion_boost = `+projectBoost(replicaSums, "id")+`, updated_at = now()
			WHERE id = ANY($1::uuid[]) AND promotion_boost <> `+projectBoost(replicaSums, "id")+`
			RETURNING 1
		), objects AS (
			UPDATE catalog.property_object_cards SET promotion_boost = `+objectBoost(replicaSums, "id", "project_id", "published")+`, updated_at = now()
			WHERE id = ANY($2::uuid[]) AND promotion_boost <> `+objectBoost(replicaSums, "id", "project_id", "published")+`
			RETURNING 1
		)
		SELECT (SELECT count(*) FROM projects) + (SELECT count(*) FROM objects)`, pq.Array(projects), pq.Array(objects))
	if err != nil {
		return 0, wrap("repair cards", err)
	}
	return n, nil
}
