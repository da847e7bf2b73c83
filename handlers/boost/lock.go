package boost

import (
	"context"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// Lock names, hashed to 64-bit advisory-lock keys. The catalog prefix keeps
// them apart from the advisory locks of other components.
const (
	purchaseLock = "catalog:purchase:"
	projectLock  = "catalog:card:Project:"
	objectLock   = "catalog:card:PropertyObject:"
)

// Lock groups, taken in this order. lockSQL spells groupObject as 2.
const (
	groupPurchase = iota
	groupProject
	groupObject
)

// lockSQL takes transaction-scoped advisory locks in one global order: the
// purchases, then the project cards, then the property-object cards (the
// given ones plus the published objects of the projects in $3), each group
// sorted by its 64-bit key. Every writer of a card's boost (Apply and the card
// upserts) takes its locks this way, so two of them never deadlock, and the
// one that waited reads the other's committed rows afterwards (READ COMMITTED
// takes a new snapshot per statement).
//
// ORDER BY applies before the volatile lock function is evaluated
// (PostgreSQL >= 9.6 postpones volatile output expressions past the sort).
// A key listed twice is simply taken twice: advisory locks are re-entrant.
const lockSQL = `SELECT pg_advisory_xact_lock(k) FROM (
	SELECT g, hashtextextended(name, 0) AS k FROM unnest($1::integer[], $2::text[]) AS u(g, name)
	UNION ALL
	SELECT 2, hashtextextended('` + objectLock + `' || id::text, 0)
	FROM catalog.property_object_cards WHERE published AND project_id = ANY($3::uuid[])
) keys ORDER BY g, k`

// lock takes the advisory locks of the given purchases, project cards,
// property-object cards and published objects of cascadeProjects (ids in
// uuid.UUID.String form, as PostgreSQL prints them). The published objects
// are read by this statement, so the caller must already hold the locks of
// cascadeProjects.
func lock(ctx context.Context, tx *sqlx.Tx, purchases, projects, objects, cascadeProjects []string) error {
	n := len(purchases) + len(projects) + len(objects)
	groups, names := make([]int64, 0, n), make([]string, 0, n)
	add := func(group int64, prefix string, ids []string) {
		for _, id := range ids {
			groups, names = append(groups, group), append(names, prefix+id)
		}
	}
	add(groupPurchase, purchaseLock, purchases)
	add(groupProject, projectLock, projects)
	add(groupObject, objectLock, objects)
	_, err := tx.ExecContext(ctx, lockSQL, pq.Array(groups), pq.Array(names), pq.Array(cascadeProjects))
	if err != nil {
		return wrap("take advisory locks", err)
	}
	return nil
}
