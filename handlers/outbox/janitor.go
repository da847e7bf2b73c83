package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// relayedPredicate matches outbox rows at or before the relay's acked
// position. Rows above it are the backlog: on a restored database too, since
// the rows a new cluster writes sort above the position (Cluster).
const relayedPredicate = `(m.transaction_id < o.last_processed_transaction_id
	OR (m.transaction_id = o.last_processed_transaction_id AND m."offset" <= o.offset_acked))`

// Cleanup deletes the rows the relay has acked, so the outbox does not grow
// without bound. Unacked rows are never touched. The position proves what
// was published only on the cluster it was acked on (a transaction id means
// nothing elsewhere): after a restore into another cluster, Cleanup deletes
// nothing until the relay acks there.
func Cleanup(ctx context.Context, db *sqlx.DB) (int64, error) {
	res, err := db.ExecContext(ctx, `DELETE FROM `+MessagesTable+` m USING `+OffsetsTable+` o
		WHERE o.consumer_group = $1
			AND o.acked_on_system_identifier = (SELECT promotion.outbox_system_identifier())
			AND `+relayedPredicate, RelayConsumerGroup)
	if err != nil {
		return 0, fmt.Errorf("clean outbox: %w", err)
	}
	return res.RowsAffected()
}

// Stats is the relay's backlog: events not yet relayed and the age of the oldest.
type Stats struct {
	// Backlog counts events, not rows: a row carries a transaction's events.
	Backlog int64
	Lag     time.Duration
}

// ReadStats measures the backlog the relay has not acked yet.
func ReadStats(ctx context.Context, db *sqlx.DB) (Stats, error) {
	var row struct {
		Backlog int64   `db:"backlog"`
		LagSecs float64 `db:"lag_seconds"`
	}
	// A row without the events key is one event (written before batches).
	// created_at is a TIMESTAMP in the session's time zone, as is localtimestamp.
	err := db.GetContext(ctx, &row, `SELECT
		COALESCE(sum(COALESCE((m.metadata->>'`+EventsMetadataKey+`')::bigint, 1)), 0)::bigint AS backlog,
		COALESCE(EXTRACT(EPOCH FROM localtimestamp - min(m.created_at)), 0)::float8 AS lag_seconds
		FROM `+MessagesTable+` m LEFT JOIN `+OffsetsTable+` o ON o.consumer_group = $1
		WHERE o.consumer_group IS NULL OR NOT `+relayedPredicate, RelayConsumerGroup)
	if err != nil {
		return Stats{}, fmt.Errorf("read outbox stats: %w", err)
	}
	return Stats{Backlog: row.Backlog, Lag: time.Duration(row.LagSecs * float64(time.Second))}, nil
}

// Writer is an outbox writer transaction in progress (BeginTx): while it
// runs, the relay reads no row of a later transaction.
type Writer struct {
	PID         int           `db:"pid" json:"pid"`
	Application string        `db:"application_name" json:"application"`
	State       string        `db:"state" json:"state"`
	Age         time.Duration `db:"-" json:"-"`
}

// OldestWriter is the outbox writer that has held the relay back longest
// (the oldest that has a transaction id), if any does. It names the
// session, never its statement: that may carry other teams' data.
func OldestWriter(ctx context.Context, db *sqlx.DB) (Writer, bool, error) {
	var row struct {
		Writer
		AgeSecs float64 `db:"age_seconds"`
	}
	err := db.GetContext(ctx, &row, `SELECT pid, coalesce(application_name, '') AS application_name,
		coalesce(state, '') AS state, EXTRACT(EPOCH FROM clock_timestamp() - xact_start)::float8 AS age_seconds
		FROM promotion.outbox_writers WHERE backend_xid IS NOT NULL ORDER BY xact_start LIMIT 1`)
	if errors.Is(err, sql.ErrNoRows) {
		return Writer{}, false, nil
	}
	if err != nil {
		return Writer{}, false, fmt.Errorf("read outbox writers: %w", err)
	}
	row.Writer.Age = time.Duration(row.AgeSecs * float64(time.Second))
	return row.Writer, true, nil
}
