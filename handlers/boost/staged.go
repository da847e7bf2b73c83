package boost

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// Staged is what a rebuild wrote to its build's unlogged tables, as it
// counted the rows. PostgreSQL empties an unlogged table in its crash
// recovery, and a failover leaves it empty on the new primary, while
// database/sql reconnects and the rebuild goes on: so each step that reads
// one of them first checks, in its own transaction, that the table holds
// what was written, and fails with a *LostError rather than build a replica
// or sums (and switch them in) from an emptied table. The new replica itself
// is logged: what its transactions committed survives a crash.
type Staged struct {
	// Events is the rows of each slice of Events (SealEvents).
	Events []int64
	// Tail is the rows copied into Tail since the last fold.
	Tail int64
	// Sums is the rows of the sums: one per target whose weight a slice of
	// the load or a fold gave it.
	Sums int64
}

// SealEvents counts the rows of each slice of Events, once the read
// committed copied rows into them, and returns the counts (Staged.Events); a
// *LostError when they do not add up to copied.
func (b Build) SealEvents(ctx context.Context, q sqlx.QueryerContext, copied int64) ([]int64, error) {
	counts := make([]string, b.Events.Slices())
	for k := range counts {
		counts[k] = `(SELECT count(*) FROM ` + b.Events.Slice(k).String() + `)`
	}
	var rows pq.Int64Array
	if err := sqlx.GetContext(ctx, q, &rows, `SELECT ARRAY[`+strings.Join(counts, ", ")+`]::bigint[]`); err != nil {
		return nil, fmt.Errorf("count staged events: %w", err)
	}
	var have int64
	for _, n := range rows {
		have += n
	}
	if have != copied {
		return nil, &LostError{Table: b.Events.String(), Have: have, Want: copied}
	}
	return rows, nil
}

// checkSumsTx fails with a *LostError unless the sums hold want rows.
func (b Build) checkSumsTx(ctx context.Context, tx *sqlx.Tx, want int64) error {
	var have int64
	if err := tx.GetContext(ctx, &have, `SELECT count(*) FROM `+b.sums()); err != nil {
		return fmt.Errorf("count sums: %w", err)
	}
	if have != want {
		return &LostError{Table: b.sums(), Have: have, Want: want}
	}
	return nil
}

// IsLost reports whether err is a staging table found emptied (*LostError).
func IsLost(err error) bool {
	var lost *LostError
	return errors.As(err, &lost)
}
