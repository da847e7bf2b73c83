package boost

import (
	"context"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/promoflow/promoflow/handlers/event"
)

// Staged events: the records of the purchase topic copied in bulk into a
// table of PostgreSQL, so that the projection rebuild and the replica audit
// work on any number of purchases in SQL and hold none of them in memory.
// One row per record that the consumer would apply, with the record's
// partition and offset. The rows go in chunks of short transactions
// (Copier), and a row PostgreSQL refuses is left out and reported rather
// than failing the copy: on a compacted topic its record stays for ever.

// EventTable is an unlogged staging table of purchase events in the catalog
// schema (nothing of it is written to the WAL, so a crash empties it: the
// rebuild and the audit count what they copy and check it before they read,
// Build.SealEvents, EventTable.CheckRows). A sliced one is hash-partitioned
// by purchase: each purchase's records lie in one slice, so that a
// statement over one slice handles whole purchases.
type EventTable struct {
	schema, name string
	// slices is the number of hash partitions; 0: a plain table.
	slices int
}

// eventColumns are the staged rows: an event's fields, its distinct card
// targets as two parallel arrays, and the record's partition and offset.
var eventColumns = []string{"purchase_id", "version", "status", "boost_weight", "ends_at", "target_kinds", "target_ids", "part", "off"}

const eventColumnsDDL = `purchase_id uuid NOT NULL, version bigint NOT NULL, status text NOT NULL,
	boost_weight integer NOT NULL, ends_at timestamptz NOT NULL, target_kinds text[] NOT NULL,
	target_ids uuid[] NOT NULL, part integer NOT NULL, off bigint NOT NULL`

// StagingTable is the unlogged staging table catalog.<name>, plain.
func StagingTable(name string) EventTable { return EventTable{schema: "catalog", name: name} }

// Sliced is t hash-partitioned by purchase into n slices (n < 1: one).
func (t EventTable) Sliced(n int) EventTable {
	t.slices = max(n, 1)
	return t
}

// Slices is how many slices t has: 1 for a plain table.
func (t EventTable) Slices() int { return max(t.slices, 1) }

// Slice is slice k of t as a table of its own; a plain table's one slice is
// itself.
func (t EventTable) Slice(k int) EventTable {
	if t.slices == 0 {
		return t
	}
	return EventTable{schema: t.schema, name: fmt.Sprintf("%s_%d", t.name, k)}
}

// String is the table's name in SQL.
func (t EventTable) String() string {
	return pq.QuoteIdentifier(t.schema) + "." + pq.QuoteIdentifier(t.name)
}

// CreateSQL creates the table, empty, with its slices. The parent of a
// sliced table holds no rows itself (and PostgreSQL 18 refuses an unlogged
// partitioned table): its slices are the unlogged tables.
func (t EventTable) CreateSQL() string {
	if t.slices == 0 {
		return `CREATE UNLOGGED TABLE ` + t.String() + ` (` + eventColumnsDDL + `)`
	}
	stmts := []string{`CREATE TABLE ` + t.String() + ` (` + eventColumnsDDL + `) PARTITION BY HASH (purchase_id)`}
	for k := range t.slices {
		stmts = append(stmts, fmt.Sprintf(`CREATE UNLOGGED TABLE %s PARTITION OF %s FOR VALUES WITH (MODULUS %d, REMAINDER %d)`,
			t.Slice(k), t, t.slices, k))
	}
	return strings.Join(stmts, ";\n")
}

// CreateTx creates the table in tx (CreateSQL).
func (t EventTable) CreateTx(ctx context.Context, tx *sqlx.Tx) error {
	if _, err := tx.ExecContext(ctx, t.CreateSQL()); err != nil {
		return fmt.Errorf("create staging table %s: %w", t, err)
	}
	return nil
}

// CheckRows fails with a *LostError unless t holds want rows.
func (t EventTable) CheckRows(ctx context.Context, q sqlx.QueryerContext, want int64) error {
	var have int64
	if err := sqlx.GetContext(ctx, q, &have, `SELECT count(*) FROM `+t.String()); err != nil {
		return fmt.Errorf("count %s: %w", t, err)
	}
	if have != want {
		return &LostError{Table: t.String(), Have: have, Want: want}
	}
	return nil
}

// LostError is a staging table that holds other than the rows copied into
// it: PostgreSQL empties an unlogged table in its crash recovery, and a
// failover leaves it empty on the new primary, while database/sql reconnects
// and the copier's user goes on.
type LostError struct {
	Table      string
	Have, Want int64
}

func (e *LostError) Error() string {
	return fmt.Sprintf("staging table %s holds %d rows, %d were copied into it: PostgreSQL emptied it (crash recovery "+
		"and a failover empty unlogged tables)", e.Table, e.Have, e.Want)
}

// LatestSQL is each purchase's latest staged event: the highest Version and,
// among equal versions, the record the consumer reads last (the greatest
// offset of its partition; a purchase's records share a partition, by key).
// It is the event the consumer's version guard leaves standing whatever the
// order of the others: the replica is a function of it alone, because every
// event is a full snapshot of the purchase and the consumer drops the targets
// a later version no longer names (apply.go).
func (t EventTable) LatestSQL() string {
	return `SELECT DISTINCT ON (purchase_id) ` + strings.Join(eventColumns, ", ") + ` FROM ` + t.String() + `
		ORDER BY purchase_id, version DESC, part DESC, off DESC`
}

// CheckRecord parses a record's value and checks its key as the consumer
// does (event.Parse, then event.CheckKey): an error is a
// *event.ContractError or an *event.KeyError, which the consumer
// dead-letters.
func CheckRecord(key, value []byte) (event.PurchaseChanged, error) {
	ev, err := event.Parse(value)
	if err != nil {
		return ev, err
	}
	return ev, event.CheckKey(key, ev)
}

// Refused is a record whose row PostgreSQL refused to store (the consumer's
// apply refuses it too and dead-letters it as sql_rejected).
type Refused struct {
	Partition int32 `json:"partition"`
	Offset    int64 `json:"offset"`
	// Code is the SQLSTATE, Reason PostgreSQL's message.
	Code   string `json:"code"`
	Reason string `json:"reason"`
}

// LoaderConfig configures a Loader.
type LoaderConfig struct {
	// DB takes the rows, a chunk per transaction (Copier). Required.
	DB *sqlx.DB
	// ChunkRows is the most rows one transaction copies. Defaults to
	// CopyChunkRowsDefault.
	ChunkRows int
	// Skipped, when set, is told of each record that breaks the contract:
	// it is not copied.
	Skipped func(partition int32, offset int64, violation error)
	// Refused, when set, is told of each record whose row PostgreSQL
	// refused: it is left out and the others are copied. Nil: a refused row
	// fails the load.
	Refused func(Refused)
	// Committed, when set, runs after each chunk commits, with the rows
	// committed so far; an error ends the load.
	Committed func(ctx context.Context, rows int64) error
	// Check parses and checks a record. Defaults to CheckRecord; a test may
	// hand the loader an event that the parser would refuse.
	Check func(key, value []byte) (event.PurchaseChanged, error)
}

// Loader copies records into an EventTable, in chunks that each commit in a
// transaction of their own. It is safe for concurrent use: each partition's
// reader parses its own records, and their rows share the chunks.
type Loader struct {
	copier *Copier
	cfg    LoaderConfig
}

// NewLoader starts copying records into t; Close ends it. ctx bounds every
// chunk's transaction.
func (t EventTable) NewLoader(ctx context.Context, cfg LoaderConfig) (*Loader, error) {
	if cfg.Check == nil {
		cfg.Check = CheckRecord
	}
	ccfg := CopyConfig{DB: cfg.DB, Schema: t.schema, Table: t.name, Columns: eventColumns, ChunkRows: cfg.ChunkRows,
		Committed: cfg.Committed}
	if cfg.Refused != nil {
		ccfg.Refused = func(row []any, err *pq.Error) {
			cfg.Refused(Refused{Partition: row[7].(int32), Offset: row[8].(int64), Code: string(err.Code), Reason: err.Message})
		}
	}
	c, err := NewCopier(ctx, ccfg)
	if err != nil {
		return nil, err
	}
	return &Loader{copier: c, cfg: cfg}, nil
}

// Add checks one record (LoaderConfig.Check) and copies its row. A record
// that breaks the contract copies nothing, and Skipped gets its error. An
// event without Project or PropertyObject targets copies nothing either: the
// consumer acks it as a no-op. The error is the copy's.
func (l *Loader) Add(partition int32, offset int64, key, value []byte) error {
	ev, err := l.cfg.Check(key, value)
	if err != nil {
		if l.cfg.Skipped != nil {
			l.cfg.Skipped(partition, offset, err)
		}
		return nil
	}
	projects, objects := splitTargets(ev.Targets)
	if len(projects)+len(objects) == 0 {
		return nil
	}
	kinds, ids := targetArrays(projects, objects)
	// Text values: lib/pq copies them as they are (a []byte would go as bytea).
	return l.copier.Add(ev.PurchaseId.String(), ev.Version, string(ev.Status), ev.BoostWeight,
		timestamptz(ev.EndsAt), kinds, ids, partition, offset)
}

// Rows is how many rows were committed so far.
func (l *Loader) Rows() int64 { return l.copier.Rows() }

// Close copies what is left: every row is committed once it returns nil.
func (l *Loader) Close() error { return l.copier.Close() }

// targetArrays are the PostgreSQL array literals of an event's distinct card
// targets: their kinds and ids, projects first.
func targetArrays(projects, objects []string) (kinds, ids string) {
	var k, i strings.Builder
	k.WriteByte('{')
	i.WriteByte('{')
	n := 0
	add := func(kind event.TargetKind, list []string) {
		for _, id := range list {
			if n > 0 {
				k.WriteByte(',')
				i.WriteByte(',')
			}
			n++
			k.WriteString(string(kind))
			i.WriteString(id)
		}
	}
	add(event.TargetProject, projects)
	add(event.TargetPropertyObject, objects)
	k.WriteByte('}')
	i.WriteByte('}')
	return k.String(), i.String()
}
