package boost

import (
	"context"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// lockSQL takes transaction-scoped advisory locks, in one global order: the
// purchases ($1), then the project cards ($2), then the property-object cards
// ($3, plus the published objects of the projects in $4), each group sorted
// by its 64-bit key. Every writer of a card's boost (Apply and the card
// upserts) takes its locks in this order, so two of them never deadlock, and
// the one that waits reads the other's committed rows afterwards (READ
// COMMITTED takes a new snapshot per statement).
//
// The keys are hashed from a catalog-only prefix so that they do not meet the
// advisory locks of other components. ORDER BY applies before the volatile
// lock function is evaluated (PostgreSQL >= 9.6 postpones volatile output
// expressions past the sort), so the locks are taken in key order.
const lockSQL = `SELECT pg_advisory_xact_lock(k) FROM (
	SELECT 0 AS g, hashtextextended('catalog:purchase:' || id::text, 0) AS k
	FROM unnest($1::uuid[]) AS id
	UNION
	SELECT 1, hashtextextended('catalog:card:Project:' || id::text, 0)
	FROM unnest($2::uuid[]) AS id
	UNION
	SELECT 2, hashtextextended('catalog:card:PropertyObject:' || id::text, 0)
	FROM unnest($3::uuid[]) AS id
	UNION
	SELECT 2, hashtextextended('catalog:card:PropertyObject:' || id::text, 0)
	FROM catalog.property_object_cards WHERE published AND project_id = ANY($4::uuid[])
) keys ORDER BY g, k`

// lock takes the advisory locks of the given purchases, project cards,
// property-object cards and published objects of cascadeProjects (ids as
// text). The published objects are read by this statement, so the caller
// must already hold the locks of cascadeProjects.
func lock(ctx context.Context, tx *sqlx.Tx, purchases, projects, objects, cascadeProjects []string) error {
	_, err := tx.ExecContext(ctx, lockSQL,
		pq.Array(purchases), pq.Array(projects), pq.Array(objects), pq.Array(cascadeProjects))
	if err != nil {
		return wrap("take advisory locks", err)
	}
	return nil
}
