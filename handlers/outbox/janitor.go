package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// relayedPredicate matches outbox rows at or before the relay's acked position.
const relayedPredicate = `(m.transaction_id < o.last_processed_transaction_id
	OR (m.transaction_id = o.last_processed_transaction_id AND m."offset" <= o.offset_acked))`

// Cleanup deletes the rows the relay has acked, so the outbox does not grow
// without bound. Unacked rows are never touched.
func Cleanup(ctx context.Context, db *sqlx.DB) (int64, error) {
	res, err := db.ExecContext(ctx, `DELETE FROM `+MessagesTable+` m USING `+OffsetsTable+` o
		WHERE o.consumer_group = $1 AND `+relayedPredicate, RelayConsumerGroup)
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
