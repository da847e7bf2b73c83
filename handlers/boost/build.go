package boost

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// Build is a PromotionBoost projection built beside the live one (blue/green)
// in tables of its own, named after its rebuild: the staged events of the
// topic (Events, in slices, and Tail for each catch-up), the new
// contributions, and every target's sum of active weights. Until SwitchTx nothing here touches
// the live projection, which the consumer keeps serving and writing; a build
// that stops anywhere leaves only its own tables, which DropBuilds removes.
// Nothing here begins or commits a transaction.
type Build struct {
	// prefix is rebuild_<id in hex>_: the tables are catalog.<prefix><role>.
	prefix string
	// Events holds the records up to the ends recorded at start; Tail those
	// of one catch-up, folded in by FoldTx.
	Events, Tail EventTable
}

// buildTablePattern matches the tables of every build (DropBuilds).
const buildTablePattern = `^rebuild_[0-9a-f]{32}_`

// NewBuild names the tables of the build of rebuild id.
func NewBuild(id uuid.UUID) Build {
	prefix := "rebuild_" + strings.ReplaceAll(id.String(), "-", "") + "_"
	return Build{prefix: prefix,
		Events: EventTable{schema: "catalog", name: prefix + "events"},
		Tail:   EventTable{schema: "catalog", name: prefix + "tail"}}
}

func (b Build) table(role string) string {
	return `catalog.` + pq.QuoteIdentifier(b.prefix+role)
}

// contributions is the new replica, LIKE catalog.promotion_contributions
// with its constraints and indexes: SwitchTx renames it into its place.
func (b Build) contributions() string { return b.table("contributions") }

// sums holds every target's sum of active weights in the new replica.
func (b Build) sums() string { return b.table("sums") }

// DropBuilds drops the tables of every build: those of a rebuild that
// stopped (its process killed or its lease lost) and, once a rebuild ended,
// its own. Call it only under the rebuild lease.
func DropBuilds(ctx context.Context, db *sqlx.DB) error {
	var tables []string
	if err := db.SelectContext(ctx, &tables, `SELECT 'catalog.' || quote_ident(relname) FROM pg_class
		WHERE relnamespace = 'catalog'::regnamespace AND relkind IN ('r', 'p') AND relname ~ $1 ORDER BY relkind, relname`,
		buildTablePattern); err != nil {
		return fmt.Errorf("list rebuild tables: %w", err)
	}
	for _, t := range tables {
		if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS `+t); err != nil {
			return fmt.Errorf("drop rebuild table %s: %w", t, err)
		}
	}
	return nil
}

// Drop drops the tables of b that exist.
func (b Build) Drop(ctx context.Context, db *sqlx.DB) error {
	if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS `+b.Events.String()+`, `+b.Tail.String()+`, `+
		b.contributions()+`, `+b.sums()); err != nil {
		return fmt.Errorf("drop rebuild tables: %w", err)
	}
	return nil
}

// Sliced is b with its Events in n slices (EventTable.Sliced): the load
// builds the new replica a slice per transaction.
func (b Build) Sliced(n int) Build {
	b.Events = b.Events.Sliced(n)
	return b
}

// CreateTx creates the build's staging tables of events, empty.
func (b Build) CreateTx(ctx context.Context, tx *sqlx.Tx) error {
	return errors.Join(b.Events.CreateTx(ctx, tx), b.Tail.CreateTx(ctx, tx))
}

// CreateReplicaTx creates the new replica, empty, and its sums. The replica
// is logged, with the live one's constraints and indexes, because it
// becomes the live one.
func (b Build) CreateReplicaTx(ctx context.Context, tx *sqlx.Tx) error {
	if _, err := tx.ExecContext(ctx, `CREATE TABLE `+b.contributions()+` (LIKE catalog.promotion_contributions INCLUDING ALL);
		CREATE UNLOGGED TABLE `+b.sums()+` (target_kind text NOT NULL, target_id uuid NOT NULL, weight integer NOT NULL,
			PRIMARY KEY (target_kind, target_id))`); err != nil {
		return fmt.Errorf("create new replica: %w", err)
	}
	return nil
}

// Loaded is what LoadSliceTx loaded.
type Loaded struct {
	// Purchases is how many purchases the slice gave the new replica,
	// Contributions how many contributions (one per purchase and card
	// target), and Targets how many targets it added to the sums.
	Purchases, Contributions, Targets int64
}

// sortMemory is the memory PostgreSQL may sort with in the build's
// statements: the latest event of every purchase of a slice (about 200
// bytes a record) is sorted in memory rather than on disk.
const sortMemory = `SET LOCAL work_mem = '256MB'; SET LOCAL maintenance_work_mem = '256MB'`

// LoadSliceTx builds the new replica's share of slice k of the staged
// events, in tx, once it checked the slice holds its staged rows: each purchase's latest event (EventTable.LatestSQL) gives
// one contribution per card target, as the consumer's version guard leaves
// them, and its active weights go into the sums. A slice holds whole
// purchases, so the slices add up to the whole replica; each is one
// bounded transaction, which holds its xid only while it writes (the
// latest events are sorted before the first row is written).
func (b Build) LoadSliceTx(ctx context.Context, tx *sqlx.Tx, k int, staged Staged) (Loaded, error) {
	var out Loaded
	if err := b.Events.Slice(k).CheckRows(ctx, tx, staged.Events[k]); err != nil {
		return out, err
	}
	if _, err := tx.ExecContext(ctx, sortMemory); err != nil {
		return out, fmt.Errorf("load new replica: %w", err)
	}
	err := tx.QueryRowxContext(ctx, `WITH latest AS (`+b.Events.Slice(k).LatestSQL()+`), written AS (
			INSERT INTO `+b.contributions()+` (purchase_id, target_kind, target_id, boost_weight, status, version, active, ends_at, updated_at)
			SELECT l.purchase_id, t.kind, t.id, l.boost_weight, l.status, l.version, l.status = 'Active', l.ends_at, now()
			FROM latest l, unnest(l.target_kinds, l.target_ids) AS t(kind, id)
			RETURNING target_kind, target_id, boost_weight, active
		), grouped AS (
			SELECT target_kind, target_id, sum(boost_weight)::integer AS weight FROM written WHERE active GROUP BY 1, 2
		), summed AS (
			INSERT INTO `+b.sums()+` AS s (target_kind, target_id, weight) SELECT target_kind, target_id, weight FROM grouped
			ON CONFLICT (target_kind, target_id) DO UPDATE SET weight = s.weight + excluded.weight
		)
		SELECT (SELECT count(*) FROM latest), (SELECT count(*) FROM written), (SELECT count(*) FROM grouped g
			WHERE NOT EXISTS (SELECT 1 FROM `+b.sums()+` s WHERE s.target_kind = g.target_kind AND s.target_id = g.target_id))`).
		Scan(&out.Purchases, &out.Contributions, &out.Targets)
	if err != nil {
		return out, fmt.Errorf("load new replica: %w", err)
	}
	return out, nil
}

// AnalyzeTx checks the sums hold their staged rows and gathers the new
// replica's and the sums' statistics, in tx, so that the consumer's
// statements are planned well on the replica from the switch on.
func (b Build) AnalyzeTx(ctx context.Context, tx *sqlx.Tx, staged Staged) error {
	if err := b.checkSumsTx(ctx, tx, staged.Sums); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `ANALYZE `+b.contributions()+`; ANALYZE `+b.sums()); err != nil {
		return fmt.Errorf("analyze new replica: %w", err)
	}
	return nil
}

// Folded is what FoldTx folded in.
type Folded struct {
	// Purchases the tail names, Contributions of the new replica it
	// changed, and Targets it added to the sums.
	Purchases, Contributions, Targets int64
}

// foldSQL folds the latest tail event of each purchase into the new replica
// with the consumer's version guard (handlers/boost/apply.go): nothing for
// an event older than the purchase's stored version, per target an upsert
// that keeps the newer row, and the deletion of the rows of targets the
// event no longer names (it is the purchase's full state). The change of
// each target's active weight goes into the sums.
func (b Build) foldSQL() string {
	return `WITH ev AS (` + b.Tail.LatestSQL() + `), old AS (
		SELECT c.purchase_id, c.target_kind, c.target_id, c.version, CASE WHEN c.active THEN c.boost_weight ELSE 0 END AS weight
		FROM ` + b.contributions() + ` c WHERE c.purchase_id IN (SELECT purchase_id FROM ev)
	), stored AS (
		SELECT e.purchase_id, coalesce((SELECT max(o.version) FROM old o WHERE o.purchase_id = e.purchase_id), 0) AS version
		FROM ev e
	), written AS (
		INSERT INTO ` + b.contributions() + ` AS c
			(purchase_id, target_kind, target_id, boost_weight, status, version, active, ends_at, updated_at)
		SELECT e.purchase_id, t.kind, t.id, e.boost_weight, e.status, e.version, e.status = 'Active', e.ends_at, now()
		FROM ev e JOIN stored s ON s.purchase_id = e.purchase_id, unnest(e.target_kinds, e.target_ids) AS t(kind, id)
		WHERE e.version >= s.version
		` + upsertContributionSQL + `
	), dropped AS (
		DELETE FROM ` + b.contributions() + ` c
		USING old o JOIN stored s ON s.purchase_id = o.purchase_id JOIN ev e ON e.purchase_id = o.purchase_id
		WHERE c.purchase_id = o.purchase_id AND c.target_kind = o.target_kind AND c.target_id = o.target_id
			AND e.version >= s.version
			AND NOT EXISTS (SELECT FROM unnest(e.target_kinds, e.target_ids) AS t(kind, id)
				WHERE t.kind = o.target_kind AND t.id = o.target_id)
		RETURNING c.purchase_id, c.target_kind, c.target_id, o.weight
	), delta AS (
		SELECT target_kind, target_id, sum(d)::integer AS d FROM (
			SELECT w.target_kind, w.target_id, w.weight - coalesce(o.weight, 0) AS d
			FROM written w LEFT JOIN old o
				ON o.purchase_id = w.purchase_id AND o.target_kind = w.target_kind AND o.target_id = w.target_id
			UNION ALL
			SELECT target_kind, target_id, -weight FROM dropped
		) x GROUP BY target_kind, target_id
	), summed AS (
		INSERT INTO ` + b.sums() + ` AS s (target_kind, target_id, weight)
		SELECT target_kind, target_id, d FROM delta WHERE d <> 0
		ON CONFLICT (target_kind, target_id) DO UPDATE SET weight = s.weight + excluded.weight
	)
	SELECT (SELECT count(*) FROM ev), (SELECT count(*) FROM written), (SELECT count(*) FROM delta d WHERE d.d <> 0
		AND NOT EXISTS (SELECT 1 FROM ` + b.sums() + ` s WHERE s.target_kind = d.target_kind AND s.target_id = d.target_id))`
}

// FoldTx folds the staged tail into the new replica and its sums, and
// empties the tail, in tx, once it checked both hold their staged rows.
func (b Build) FoldTx(ctx context.Context, tx *sqlx.Tx, staged Staged) (Folded, error) {
	var out Folded
	if err := b.Tail.CheckRows(ctx, tx, staged.Tail); err != nil {
		return out, err
	}
	if err := b.checkSumsTx(ctx, tx, staged.Sums); err != nil {
		return out, err
	}
	if err := tx.QueryRowxContext(ctx, b.foldSQL()).Scan(&out.Purchases, &out.Contributions, &out.Targets); err != nil {
		return out, fmt.Errorf("fold catch-up into new replica: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `TRUNCATE `+b.Tail.String()); err != nil {
		return out, fmt.Errorf("empty catch-up: %w", err)
	}
	return out, nil
}

// LockProjectionTx holds back every writer of the live projection (events,
// card upserts, repairs) until tx ends, and waits for those in flight, in
// the global lock order (lockProjectionSQL). Readers go on.
func LockProjectionTx(ctx context.Context, tx *sqlx.Tx) error {
	if _, err := tx.ExecContext(ctx, lockProjectionSQL); err != nil {
		return wrap("lock projection", err)
	}
	return nil
}

// SwitchTx makes the build the live projection, in tx, which holds
// LockProjectionTx and has folded the last tail in: it sets every card whose
// boost differs to the formula over the build's sums (only promotion_boost is
// written, INV-1), then drops the live replica and renames the new one, with
// its indexes, into its place, once it refused a new replica that differs
// from the live one and gave it the live one's owner, grants and storage
// options (carry.go; a *ChangedError). It returns how many cards changed.
//
// Readers of the cards never wait. Readers of the replica wait from the
// rename's ACCESS EXCLUSIVE lock to the commit. A statement that the consumer
// prepared on the old table is planned again on the new one: PostgreSQL
// invalidates its cached plans when the table is dropped.
func (b Build) SwitchTx(ctx context.Context, tx *sqlx.Tx) (int, error) {
	var cards int
	if err := tx.GetContext(ctx, &cards, recomputeCardsSQL("", b.sums())); err != nil {
		return 0, wrap("switch cards", err)
	}
	if _, err := tx.ExecContext(ctx, `LOCK TABLE catalog.promotion_contributions IN ACCESS EXCLUSIVE MODE`); err != nil {
		return 0, wrap("lock replica for the switch", err)
	}
	if err := b.carryOverTx(ctx, tx); err != nil {
		return 0, err
	}
	renames, err := b.indexNames(ctx, tx)
	if err != nil {
		return 0, err
	}
	stmts := []string{`DROP TABLE catalog.promotion_contributions`,
		`ALTER TABLE ` + b.contributions() + ` RENAME TO promotion_contributions`}
	for staged, live := range renames {
		stmts = append(stmts, `ALTER INDEX catalog.`+pq.QuoteIdentifier(staged)+` RENAME TO `+pq.QuoteIdentifier(live))
	}
	if _, err := tx.ExecContext(ctx, strings.Join(stmts, ";\n")); err != nil {
		return 0, wrap("switch replica", err)
	}
	return cards, nil
}

// indexNames pairs each index of the new replica with the live one's index of
// the same definition, so that the new ones take the live names.
func (b Build) indexNames(ctx context.Context, tx *sqlx.Tx) (map[string]string, error) {
	staged, err := indexesOf(ctx, tx, b.contributions())
	if err != nil {
		return nil, err
	}
	live, err := indexesOf(ctx, tx, "catalog.promotion_contributions")
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(staged))
	for _, n := range staged {
		for _, o := range live {
			if n.Def == o.Def && n.Unique == o.Unique {
				out[n.Name] = o.Name
			}
		}
	}
	if len(out) != len(staged) || len(staged) != len(live) {
		return nil, &ChangedError{What: "indexes", Live: fmt.Sprint(live), Build: fmt.Sprint(staged)}
	}
	return out, nil
}

// index is one index of a table: its name and its definition after USING
// (method, columns, INCLUDE, WHERE), which names no table.
type index struct {
	Name   string `db:"name"`
	Def    string `db:"def"`
	Unique bool   `db:"uniq"`
}

func indexesOf(ctx context.Context, tx *sqlx.Tx, table string) ([]index, error) {
	var out []index
	if err := tx.SelectContext(ctx, &out, `SELECT c.relname AS name, i.indisunique AS uniq,
			regexp_replace(pg_get_indexdef(i.indexrelid), '^.* USING ', '') AS def
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass ORDER BY 1`, table); err != nil {
		return nil, fmt.Errorf("indexes of %s: %w", table, err)
	}
	return out, nil
}
