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

// CooldownError is a rebuild requested within the cooldown after the last
// one started (Config.Cooldown).
type CooldownError struct {
	// RetryAfter is when the cooldown ends, from now.
	RetryAfter time.Duration
}

func (e *CooldownError) Error() string {
	return fmt.Sprintf("a rebuild started less than the cooldown ago; the next may start in %s", e.RetryAfter.Round(time.Second))
}

// acquire records st as the running rebuild, or returns ErrRunning when
// another one holds the lease, or a *CooldownError when the last one started
// within cooldown (0: none).
func acquire(ctx context.Context, db *sqlx.DB, st Status, staleAfter, cooldown time.Duration) error {
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
	if cooldown > 0 {
		// The rows are the cluster's history of rebuilds, so the cooldown
		// holds across processes: each rebuild re-reads the whole topic and
		// rewrites the replica, and a loop of requests would keep it busy.
		// Read after the insert: a running rebuild answers ErrRunning first,
		// and a refused one's row is rolled back.
		var wait float64
		if err := tx.GetContext(ctx, &wait, `SELECT COALESCE(EXTRACT(EPOCH FROM max(started_at) + make_interval(secs => $1) - now()), 0)::float8
			FROM catalog.projection_rebuilds WHERE id <> $2`, cooldown.Seconds(), st.ID); err != nil {
			return fmt.Errorf("read last rebuild start: %w", err)
		}
		if wait > 0 {
			return &CooldownError{RetryAfter: time.Duration(wait * float64(time.Second))}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit rebuild lease: %w", err)
	}
	return nil
}
