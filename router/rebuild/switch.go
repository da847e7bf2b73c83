package rebuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/router/bounded"
	"github.com/promoflow/promoflow/sqlmigrate"
)

// switchGivingWay runs the switch until it commits or fails for another
// reason than a lock it waited Config.SwitchWait for: then it lets the
// writers go on for as long, catches up and tries again.
func (r *Rebuilder) switchGivingWay(ctx context.Context, client *bounded.Client, b boost.Build, cur *run, log *slog.Logger,
	ends map[int32]int64) error {
	for {
		var err error
		ends, err = r.switchOver(ctx, client, b, cur, log, ends)
		if !lockTimedOut(err) {
			return err
		}
		log.Warn("the switch gave way: a lock it needs was held longer than the switch wait; the projection's writers go on, and the switch tries again",
			"switchWaitMs", r.cfg.SwitchWait.Milliseconds(), "holders", r.replicaHolders(ctx), "error", err)
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(r.cfg.SwitchWait):
		}
		if ends, err = r.catchUp(ctx, client, b, cur, log, ends); err != nil {
			return err
		}
	}
}

// lockTimedOut reports whether err is PostgreSQL's lock_timeout (55P03).
func lockTimedOut(err error) bool {
	var pqErr *pq.Error
	return errors.As(err, &pqErr) && pqErr.Code == pqerror.LockNotAvailable
}

// replicaHolders describes the other sessions that hold a lock on the live
// replica, for the log of a switch that gave way to them. Best effort: an
// error is described instead.
func (r *Rebuilder) replicaHolders(ctx context.Context) []string {
	var out []string
	err := r.cfg.DB.SelectContext(ctx, &out, `SELECT format('pid %s (%s), in a transaction for %s: %s', a.pid,
			coalesce(nullif(a.application_name, ''), 'no application name'), date_trunc('second', now() - a.xact_start), left(a.query, 120))
		FROM pg_stat_activity a
		WHERE a.pid <> pg_backend_pid() AND a.pid IN (
			SELECT l.pid FROM pg_locks l WHERE l.granted AND l.relation = 'catalog.promotion_contributions'::regclass)
		ORDER BY a.xact_start`)
	if err != nil {
		return []string{"not known: " + err.Error()}
	}
	return out
}

// switchOver is the switch's one transaction (see the package comment). It
// returns the ends up to which it copied the records into the tail: those
// stay there when the switch rolls back, and the next catch-up goes on from
// these ends, so that no record is read, counted or logged twice.
func (r *Rebuilder) switchOver(ctx context.Context, client *bounded.Client, b boost.Build, cur *run, log *slog.Logger,
	ends map[int32]int64) (map[int32]int64, error) {
	copied := ends
	err := r.inTx(ctx, "switch", func(ctx context.Context, tx *sqlx.Tx) error {
		// Every lock of the switch waits SwitchWait at most: past it the
		// switch rolls back and the writers it held back go on.
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, r.cfg.SwitchWait.Milliseconds())); err != nil {
			return fmt.Errorf("set the switch's lock timeout: %w", err)
		}
		// Before any table lock: a migration under way is waited for
		// holding nothing, and none starts before the switch ends.
		if err := sqlmigrate.HoldMigrationsTx(ctx, tx); err != nil {
			return err
		}
		if err := boost.LockProjectionTx(ctx, tx); err != nil {
			return err
		}
		if err := r.at(ctx, pointSwitchLocked); err != nil {
			return err
		}
		// Read now, while no writer of the projection can commit: every
		// event the consumer committed lies below these ends.
		next, ranges, err := r.since(client, ends)
		if err != nil {
			return err
		}
		cur.progress.Extend(ranges)
		// Copied in transactions of their own, which the switch's reads see.
		n, err := r.copy(ctx, client, b.Tail, ranges, cur, log, "")
		cur.staged.Tail += n
		if err != nil {
			return err
		}
		copied = next
		if _, err := b.FoldTx(ctx, tx, cur.staged); err != nil {
			return err
		}
		cards, err := b.SwitchTx(ctx, tx)
		if err != nil {
			return err
		}
		cur.cardsChanged.Store(int64(cards))
		if err := r.at(ctx, pointSwitch); err != nil {
			return err
		}
		// Last, so that a rebuild whose lease was taken over switches nothing.
		done := cur.status(StateDone)
		now := time.Now().UTC()
		done.FinishedAt = &now
		return saveStatus(ctx, tx, done)
	}, func() { cur.switched.Store(true) })
	return copied, err
}
