// Package retention deletes rows older than a retention, batch by batch, so
// that a cleanup of a large backlog never holds one long transaction.
package retention

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// Batch is how many rows one DELETE takes.
const Batch = 10_000

// Delete deletes the rows of table whose column (a timestamp with an index)
// is older than keep, and returns how many it deleted. table and column are
// the caller's constants, never input.
func Delete(ctx context.Context, db sqlx.ExecerContext, table, column string, keep time.Duration) (int64, error) {
	query := `DELETE FROM ` + table + ` WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM ` + table + ` WHERE ` + column + ` < now() - make_interval(secs => $1) LIMIT $2))`
	var total int64
	for {
		res, err := db.ExecContext(ctx, query, keep.Seconds(), Batch)
		if err != nil {
			return total, fmt.Errorf("clean %s: %w", table, err)
		}
		n, err := res.RowsAffected()
		total += n
		if err != nil || n < Batch {
			return total, err
		}
	}
}
