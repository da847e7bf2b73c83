package boost

import (
	"context"
	"hash/fnv"
	"slices"
	"strconv"

	"github.com/lib/pq"

	"github.com/promoflow/promoflow/handlers/event"
)

// Locking: one advisory lock per purchase, and at most lockStripes advisory
// locks per target kind, however many targets an event names or objects a
// project has. Per-target locks once filled PostgreSQL's shared lock table
// (max_locks_per_transaction × (max_connections + 22) entries; 53200 out of
// shared memory for every session of the server) when two events of 12,000
// targets ran at once. Row locks on cards (FOR NO KEY UPDATE) live in the
// rows, not in that table.
//
// Targets of one kind take their own locks while they are no more than
// lockStripes, and the locks of their stripes (a hash of the id) when they
// are more. A writer that takes its targets exclusive (a card upsert, a
// repair) takes both, each target's own lock and its stripe's, so it
// excludes an event on its target whichever locks the event took. Events
// take theirs shared and never wait for each other there. An exclusive
// writer waits for wide events in flight on any target of its stripe:
// more than it needs, never less.
//
// Lock order, the same in every transaction that writes a boost:
//
//  0. the consumer's dedup marks (rows of catalog.processed_records, in
//     digest order, then of catalog.processed_messages, in key order), when
//     the transaction is the consumer's unit of work;
//  1. advisory locks, in one statement, sorted by (group, 64-bit key):
//     the purchases (exclusive), then projects, then property objects
//     (a target's own lock and a stripe's share the group of their kind);
//     ApplyBatch then tries (never waits for) the own locks of the targets
//     that its purchases' stored contributions name and their new versions
//     drop, which it can read only under the purchase locks, in a statement
//     that takes the card tables (ROW SHARE) before it reads the
//     contribution table (lockEvents, lockDroppedSQL);
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
//     PropertyObject target shared, the new version's and the stored
//     contributions' alike: a target the new version drops loses its
//     weight, so it is written as any other. Events of different purchases
//     add deltas, which commute: they share the target locks and queue only
//     on the rows of the cards they both change (x = x + d under a row lock).
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

// lockStripes is how many stripes the Project targets share, and as many
// the PropertyObject targets. 16 keeps a transaction of wide events at 33
// advisory locks, within PostgreSQL's default max_locks_per_transaction (64)
// with room for its relation locks, and makes an upsert wait for an
// unrelated wide event only when both touch one of 16 stripes.
const lockStripes = 16

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

// lockDroppedSQL finds the targets that the stored contributions of
// purchases $1 name and that the transaction has not locked ($2 projects, $3
// property objects: the new versions' targets), the ones a new version
// drops, and tries to take their shared locks, sorted as lockSQL sorts. It
// returns them as projects and objects, and whether every lock was granted.
// It runs under the purchases' locks, so it reads the contributions as the
// last writer of each purchase left them. The card tables come first (ROW
// SHARE, taken as the statement starts, before the replica's ACCESS SHARE),
// as in lockCardsSQL: a switch that holds them waits for no lock of ours on
// the replica. It never waits for an advisory lock: it holds table locks
// that a switch queued behind a card upsert could be waiting for.
const lockDroppedSQL = `WITH cards AS (
	SELECT FROM catalog.project_cards, catalog.property_object_cards WHERE false FOR NO KEY UPDATE
), stored AS (
	SELECT CASE c.target_kind WHEN 'Project' THEN 1 ELSE 2 END AS g, c.target_id::text AS id
	FROM catalog.promotion_contributions c
	WHERE (SELECT count(*) FROM cards) >= 0 AND c.purchase_id = ANY($1::uuid[])
		AND c.target_id::text <> ALL(CASE c.target_kind WHEN 'Project' THEN $2::text[] ELSE $3::text[] END)
), tried AS (
	SELECT g, id, pg_try_advisory_xact_lock_shared(k) AS granted FROM (
		SELECT g, id, hashtextextended(CASE g WHEN 1 THEN '` + projectLock + `' ELSE '` + objectLock + `' END || id, 0) AS k
		FROM stored
	) keyed
	ORDER BY g, k
)
SELECT coalesce(array_agg(id) FILTER (WHERE g = 1), '{}') AS projects,
	coalesce(array_agg(id) FILTER (WHERE g = 2), '{}') AS objects, coalesce(bool_and(granted), true) AS granted
FROM tried`

// lockSavepoint is where lockEvents goes back to when a card upsert holds a
// dropped target.
const lockSavepoint = `boost_locks`

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
// the lock bound of the consumer's group commit: its purchase and, per kind,
// each distinct Project and PropertyObject target or, past lockStripes of a
// kind, their stripes; none for an event of Post targets only. Its cascade
// to a project's objects takes no advisory lock.
func Locks(ev event.PurchaseChanged) int {
	projects, objects := splitTargets(ev.Targets)
	if len(projects)+len(objects) == 0 {
		return 0
	}
	return 1 + len(targetLocks(projects, true)) + len(targetLocks(objects, true))
}

// targetLocks names the locks of distinct targets of one kind: their own
// while they are no more than lockStripes, else their stripes; and, for an
// exclusive writer, both.
func targetLocks(ids []string, shared bool) []string {
	switch {
	case !shared:
		return append(slices.Clip(ids), stripes(ids)...)
	case len(ids) <= lockStripes:
		return ids
	default:
		return stripes(ids)
	}
}

// stripes maps target ids to their distinct stripes, in order of first use.
func stripes(ids []string) []string {
	seen := make(map[uint64]bool, min(len(ids), lockStripes))
	var out []string
	for _, id := range ids {
		h := fnv.New64a()
		h.Write([]byte(id)) //nolint:errcheck // a hash never fails
		n := h.Sum64() % lockStripes
		if !seen[n] {
			seen[n] = true
			out = append(out, "stripe:"+strconv.FormatUint(n, 10))
		}
	}
	return out
}

// lockEvents takes the advisory locks of an ApplyBatch in the global order:
// its purchases exclusive and its new targets shared (lockSQL), then the
// shared locks of the targets the purchases' stored contributions name and
// the new versions drop (lockDroppedSQL), adding those to l so that the card
// rows of their cascade are locked too. The stored targets are known only
// once the purchase locks are held, so their locks come last; they are only
// tried, because the statement holds table locks. When a card upsert holds
// one, everything since the savepoint is let go, and the locks are taken
// again, the dropped targets among them, all in order: waiting only for
// advisory locks while holding advisory locks that come before.
func lockEvents(ctx context.Context, q querier, l *locks) error {
	if !q.savepoint {
		if err := q.exec(ctx, `SAVEPOINT `+lockSavepoint); err != nil {
			return wrap("savepoint before locks", err)
		}
	}
	for {
		if err := lock(ctx, q, *l); err != nil {
			return err
		}
		var dropped struct {
			Projects pq.StringArray `db:"projects"`
			Objects  pq.StringArray `db:"objects"`
			Granted  bool           `db:"granted"`
		}
		if err := q.get(ctx, &dropped, lockDroppedSQL, pq.Array(l.Purchases), pq.Array(l.Projects), pq.Array(l.Objects)); err != nil {
			return wrap("lock dropped targets", err)
		}
		l.Projects, l.Objects = append(l.Projects, dropped.Projects...), append(l.Objects, dropped.Objects...)
		if dropped.Granted {
			return nil
		}
		if err := q.exec(ctx, `ROLLBACK TO SAVEPOINT `+lockSavepoint); err != nil {
			return wrap("let go of locks", err)
		}
	}
}

// locks names the advisory locks one transaction takes (ids in
// uuid.UUID.String form, as PostgreSQL prints them, which lockDroppedSQL
// compares with the stored ids); targetLocks decides which locks its
// targets take.
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
	projects, objects := targetLocks(l.Projects, l.Shared), targetLocks(l.Objects, l.Shared)
	n := len(l.Purchases) + len(projects) + len(objects)
	groups, names := make([]int64, 0, n), make([]string, 0, n)
	add := func(group int64, prefix string, ids ...string) {
		for _, id := range ids {
			groups, names = append(groups, group), append(names, prefix+id)
		}
	}
	add(groupPurchase, purchaseLock, l.Purchases...)
	add(groupProject, projectLock, projects...)
	add(groupObject, objectLock, objects...)
	if err := q.exec(ctx, lockSQL, pq.Array(groups), pq.Array(names), l.Shared); err != nil {
		return wrap("take advisory locks", err)
	}
	return nil
}
