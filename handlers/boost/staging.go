package boost

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/promoflow/promoflow/handlers/event"
)

// Staged events: the records of the purchase topic copied in bulk into a
// table of PostgreSQL, so that the projection rebuild and the replica audit
// work on any number of purchases in SQL and hold none of them in memory.
// One row per record that the consumer would apply, with the record's
// partition and offset.

// EventTable is a staging table of purchase events: unlogged (a rebuild's)
// or temporary (an audit's), never a table that must survive a crash.
type EventTable struct {
	// schema is empty for a temporary table.
	schema, name string
}

// eventColumns are the staged rows: an event's fields, its distinct card
// targets as two parallel arrays, and the record's partition and offset.
var eventColumns = []string{"purchase_id", "version", "status", "boost_weight", "ends_at", "target_kinds", "target_ids", "part", "off"}

const eventColumnsDDL = `purchase_id uuid NOT NULL, version bigint NOT NULL, status text NOT NULL,
	boost_weight integer NOT NULL, ends_at timestamptz NOT NULL, target_kinds text[] NOT NULL,
	target_ids uuid[] NOT NULL, part integer NOT NULL, off bigint NOT NULL`

// TempEventTable is a temporary staging table of the session, dropped when
// the transaction that creates it (CreateTx) ends.
func TempEventTable(name string) EventTable { return EventTable{name: name} }

// String is the table's name in SQL.
func (t EventTable) String() string {
	if t.schema == "" {
		return pq.QuoteIdentifier(t.name)
	}
	return pq.QuoteIdentifier(t.schema) + "." + pq.QuoteIdentifier(t.name)
}

// CreateTx creates the table in tx, empty: temporary (dropped at commit) or
// unlogged (nothing of it is written to the WAL).
func (t EventTable) CreateTx(ctx context.Context, tx *sqlx.Tx) error {
	ddl := `CREATE UNLOGGED TABLE ` + t.String() + ` (` + eventColumnsDDL + `)`
	if t.schema == "" {
		ddl = `CREATE TEMPORARY TABLE ` + t.String() + ` (` + eventColumnsDDL + `) ON COMMIT DROP`
	}
	if _, err := tx.ExecContext(ctx, ddl); err != nil {
		return fmt.Errorf("create staging table %s: %w", t, err)
	}
	return nil
}

// LatestSQL is each purchase's latest staged event: the highest Version and,
// among equal versions, the record the consumer reads last (the greatest
// offset of its partition; a purchase's records share a partition, by key).
// It is the event the consumer's version guard leaves standing whatever the
// order of the others: the replica is a function of it (a purchase's targets
// never change: every event is a full snapshot of the purchase).
func (t EventTable) LatestSQL() string {
	return `SELECT DISTINCT ON (purchase_id) ` + strings.Join(eventColumns, ", ") + ` FROM ` + t.String() + `
		ORDER BY purchase_id, version DESC, part DESC, off DESC`
}

// Loader copies records into an EventTable with one COPY, in the caller's
// transaction. It is safe for concurrent use: each partition's reader parses
// its own records, and their rows share the COPY stream.
type Loader struct {
	mu     sync.Mutex
	stmt   *sql.Stmt
	closed bool
	rows   atomic.Int64
	onSkip func(partition int32, offset int64, violation error)
}

// LoaderTx starts a COPY into t in tx; Close ends it. onSkip, when set, is
// told of each record that breaks the contract (Add).
func (t EventTable) LoaderTx(ctx context.Context, tx *sqlx.Tx, onSkip func(partition int32, offset int64, violation error)) (*Loader, error) {
	query := pq.CopyInSchema(t.schema, t.name, eventColumns...)
	if t.schema == "" {
		query = pq.CopyIn(t.name, eventColumns...)
	}
	stmt, err := tx.PrepareContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("copy into %s: %w", t, err)
	}
	return &Loader{stmt: stmt, onSkip: onSkip}, nil
}

// Add checks one record as the consumer does (event.Parse, then
// event.CheckKey on the record's key) and copies its row. A record that
// breaks the contract copies nothing, and onSkip gets its
// *event.ContractError or *event.KeyError: the consumer dead-letters it. An
// event without Project or PropertyObject targets copies nothing either: the
// consumer acks it as a no-op. The error is the COPY's.
func (l *Loader) Add(partition int32, offset int64, key, value []byte) error {
	ev, err := event.Parse(value)
	if err == nil {
		err = event.CheckKey(key, ev)
	}
	if err != nil {
		if l.onSkip != nil {
			l.onSkip(partition, offset, err)
		}
		return nil
	}
	projects, objects := splitTargets(ev.Targets)
	if len(projects)+len(objects) == 0 {
		return nil
	}
	kinds, ids := targetArrays(projects, objects)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("copy events: the loader is closed")
	}
	// Text values: lib/pq copies them as they are (a []byte would go as bytea).
	if _, err := l.stmt.Exec(ev.PurchaseId.String(), ev.Version, string(ev.Status), ev.BoostWeight,
		timestamptz(ev.EndsAt), kinds, ids, partition, offset); err != nil {
		return fmt.Errorf("copy events: %w", err)
	}
	l.rows.Add(1)
	return nil
}

// Rows is how many rows were copied so far.
func (l *Loader) Rows() int64 { return l.rows.Load() }

// Close ends the COPY: the rows are in the table once it returns nil, and
// visible to others once the transaction commits.
func (l *Loader) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	_, err := l.stmt.Exec()
	return errors.Join(wrapCopy(err), l.stmt.Close())
}

func wrapCopy(err error) error {
	if err != nil {
		return fmt.Errorf("end copy of events: %w", err)
	}
	return nil
}

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
