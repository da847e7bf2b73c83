package rebuild

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// The lease that lets one rebuild run at a time in the whole cluster is the
// one row of catalog.projection_rebuilds in state running (a unique index
// allows no second). Its rebuild writes its progress every StatusEvery; a
// running row older than StaleAfter lost its process, and the next rebuild
// marks it failed and takes the lease. Nothing here outlives a transaction,
// so the lease holds behind a pooler in transaction mode, where a session
// advisory lock would stay with whichever server connection took it.

// errLeaseLost is a rebuild whose row another rebuild marked abandoned: it
// went longer than StaleAfter without writing its progress.
var errLeaseLost = errors.New("rebuild lease lost: no progress written for longer than the stale limit, and another rebuild took over")

// acquire records st as the running rebuild, or returns ErrRunning when
// another one holds the lease.
func acquire(ctx context.Context, db *sqlx.DB, st Status, staleAfter time.Duration) error {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin rebuild lease: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	if _, err := tx.ExecContext(ctx, `UPDATE catalog.projection_rebuilds
		SET state = 'failed', finished_at = now(), error = $1
		WHERE state = 'running' AND updated_at < now() - make_interval(secs => $2)`,
		fmt.Sprintf("abandoned: no progress for more than %s (its process stopped)", staleAfter), staleAfter.Seconds()); err != nil {
		return fmt.Errorf("end abandoned rebuild: %w", err)
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO catalog.projection_rebuilds (id, state, started_at, updated_at)
		VALUES ($1, 'running', $2, now()) ON CONFLICT DO NOTHING`, st.ID, st.StartedAt)
	if err != nil {
		return fmt.Errorf("record rebuild: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return errors.Join(ErrRunning, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit rebuild lease: %w", err)
	}
	return nil
}
