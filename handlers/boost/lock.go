package boost

import (
	"context"

	"github.com/lib/pq"

	"github.com/promoflow/promoflow/handlers/event"
)

// Locking: at most one advisory lock per purchase and per target, however
// many objects a project has (a project of 40,000 published objects once took
// 40,000 locks and overflowed PostgreSQL's shared lock table: 53200).
//
// Lock order, the same in every transaction that writes a boost:
//
//  0. the consumer's dedup marks (rows of catalog.processed_records, in
//     digest order, then of catalog.processed_messages, in key order), when
//     the transaction is the consumer's unit of work;
//  1. advisory locks, in one statement, sorted by (group, 64-bit key):
//     the purchases (exclusive), then projects, then property objects;
//  2. the card tables, then card rows, in one statement (lockCardsSQL):
//     project_cards and property_object_cards (ROW SHARE, taken as the
//     statement starts), then project cards sorted by id, then
//     property-object cards sorted by id (ORDER BY id FOR NO KEY UPDATE).
//     The apply statement that follows writes only rows it holds, so it
//     never waits and never re-checks a row (EvalPlanQual): two batches on
//     shared cards queue in this cheap statement instead;
//  3. the contribution table (the apply statement);
//  4. the consumer's offset rows (catalog.consumer_offsets, in topic and
//     partition order), last, when the transaction is the consumer's unit
//     of work. Each group-commit worker writes rows of its own slot, so the
//     batches of one process never wait for each other there; the rows of
//     another process's worker only around a rebalance, once they hold
//     everything else. No other writer takes them.
//
// A whole-projection writer (a rebuild's switch, LockProjectionTx;
// RecomputeAllTx: lockProjectionSQL) takes the three tables EXCLUSIVE in the
// same order, card tables first, then the contributions. It takes no
// advisory lock and needs no dedup mark row that a batch holds, so it waits
// only for the card
// tables of batches in flight, while holding nothing they still need.
//
// A transaction waits only for a lock that comes later in this order than
// every lock it holds, so writers of boosts never deadlock. A card table
// lock the writer is queued for does not stop a batch that already holds
// that table from taking its write lock on it (PostgreSQL grants a lock
// ahead of a queued request that conflicts with one the requester holds).
//
// Who takes what, and why:
//
//   - ApplyBatch: every purchase of the batch exclusive, so that the events
//     of one purchase run one at a time and the contribution rows its
//     statement reads as "old" are the ones it replaces; each Project and
//     PropertyObject target shared. Events of different purchases add deltas, which commute: they
//     share the target locks and queue only on the rows of the cards they
//     both change (x = x + d under a row lock).
//   - UpsertProjectCardTx: its project exclusive. UpsertPropertyObjectCardTx:
//     its (new) project, then itself, exclusive. A card upsert computes the
//     boost from sums, so it must not overlap an event on the same target:
//     the upsert's sum would miss the event's contribution, or the event's
//     cascade would miss the card (a new published object is a phantom to a
//     snapshot taken before it was inserted). Whichever takes the target's
//     lock second waits for the first one's commit and, because ApplyBatch and
//     the upserts read only in statements after their lock statement (READ
//     COMMITTED takes a new snapshot per statement), sees its rows.
//   - An object that leaves a project (moved or unpublished) needs no lock on
//     the project it leaves: an event of that project locks the object's row
//     before it adds the delta, and the lock re-checks project_id and
//     published on the row's newest version (EvalPlanQual), so the event
//     skips an object that has left, or adds to it before the upsert
//     overwrites the boost with the sums of its new state.
//
// Lock names, hashed to 64-bit advisory-lock keys. The catalog prefix keeps
// them apart from the advisory locks of other components.
const (
	purchaseLock = "catalog:purchase:"
	projectLock  = "catalog:card:Project:"
	objectLock   = "catalog:card:PropertyObject:"
)

// Lock groups, taken in this order.
const (
	groupPurchase = iota
	groupProject
	groupObject
)

// lockSQL takes transaction-scoped advisory locks sorted by group and key:
// the purchase group always exclusive, the targets shared when $3 is true.
// ORDER BY applies before the volatile lock functions are evaluated
// (PostgreSQL >= 9.6 postpones volatile output expressions past the sort).
// A key listed twice is simply taken twice: advisory locks are re-entrant.
const lockSQL = `SELECT CASE WHEN g <> 0 AND $3::boolean THEN pg_advisory_xact_lock_shared(k)
		ELSE pg_advisory_xact_lock(k) END
	FROM (SELECT g, hashtextextended(name, 0) AS k FROM unnest($1::integer[], $2::text[]) AS u(g, name)) keys
	ORDER BY g, k`

// lockCardsSQL locks the card rows that events on projects $1 and property
// objects $2 can write: the project cards, then the objects that are a
// target or a published object of a target project, each in id order.
const lockCardsSQL = `WITH p AS (
	SELECT id FROM catalog.project_cards WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
), o AS (
	SELECT id FROM catalog.property_object_cards
	WHERE (SELECT count(*) FROM p) >= 0
		AND (id = ANY($2::uuid[]) OR (published AND project_id = ANY($1::uuid[])))
	ORDER BY id FOR NO KEY UPDATE
)
SELECT count(*) FROM o`

// Locks is how many advisory locks ApplyBatch takes for ev, counted against
// the lock bound of the consumer's group commit: its purchase and each
// distinct Project and PropertyObject target, none for an event of Post
// targets only. Its cascade to a project's objects takes no advisory lock.
func Locks(ev event.PurchaseChanged) int {
	projects, objects := splitTargets(ev.Targets)
	if n := len(projects) + len(objects); n > 0 {
		return 1 + n
	}
	return 0
}

// locks names the advisory locks one transaction takes (ids in
// uuid.UUID.String form, as PostgreSQL prints them).
type locks struct {
	// Purchases are locked exclusive.
	Purchases []string
	// Projects and Objects are the targets' locks.
	Projects, Objects []string
	// Shared takes the target locks shared (events) instead of exclusive
	// (card upserts).
	Shared bool
}

// lock takes l in the global lock order.
func lock(ctx context.Context, q querier, l locks) error {
	n := len(l.Purchases) + len(l.Projects) + len(l.Objects)
	groups, names := make([]int64, 0, n), make([]string, 0, n)
	add := func(group int64, prefix string, ids ...string) {
		for _, id := range ids {
			groups, names = append(groups, group), append(names, prefix+id)
		}
	}
	add(groupPurchase, purchaseLock, l.Purchases...)
	add(groupProject, projectLock, l.Projects...)
	add(groupObject, objectLock, l.Objects...)
	if err := q.exec(ctx, lockSQL, pq.Array(groups), pq.Array(names), l.Shared); err != nil {
		return wrap("take advisory locks", err)
	}
	return nil
}
