package rebuild

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/router/bounded"
	"github.com/promoflow/promoflow/sqlmigrate"
)

// switchGivingWay runs the switch until it commits or fails for another
// reason than giving way (gaveWay): then it lets the writers go on, catches
// up and tries again.
func (r *Rebuilder) switchGivingWay(ctx context.Context, client *bounded.Client, b boost.Build, cur *run, log *slog.Logger,
	ends map[int32]int64) error {
	for {
		var err error
		ends, err = r.switchOver(ctx, client, b, cur, log, ends)
		reason, waitFirst := r.gaveWay(ctx, err)
		if reason == "" {
			return err
		}
		log.Warn("the switch gave way; the projection's writers go on, and the switch tries again once it caught up",
			"reason", reason, "switchWaitMs", r.cfg.SwitchWait.Milliseconds(), "holders", r.replicaHolders(ctx), "error", err.Error())
		if waitFirst {
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(r.cfg.SwitchWait):
			}
		}
		if ends, err = r.catchUp(ctx, client, b, cur, log, ends); err != nil {
			return err
		}
	}
}

// connectionLost reports whether err is a database connection that broke:
// lib/pq answers a statement on a connection the server or the network
// closed with driver.ErrBadConn, the network's error, or an EOF.
func connectionLost(err error) bool {
	var netErr net.Error
	return errors.Is(err, driver.ErrBadConn) || errors.As(err, &netErr) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF)
}

// sessionEnded is a switch whose connection broke before it committed:
// PostgreSQL ended its session (past the idle timeout, a cut-off client's),
// or the network did.
type sessionEnded struct{ err error }

func (e *sessionEnded) Error() string { return "the switch's database session ended: " + e.err.Error() }
func (e *sessionEnded) Unwrap() error { return e.err }

// tailError is a switch that found more records past the last catch-up than
// it may fold in under its locks (Config.SwitchMaxRecords).
type tailError struct{ records, most int64 }

func (e *tailError) Error() string {
	return fmt.Sprintf("%d records arrived since the last catch-up, more than the %d the switch folds in while it holds the writers back",
		e.records, e.most)
}

// gaveWay says why the switch that failed with err gave way, "" if it did
// not: it waited too long for a lock (lock_timeout), a statement of it ran
// too long (statement_timeout) or it paused too long between two
// (idle_in_transaction_session_timeout: PostgreSQL ended its session), or
// too many records were pending. waitFirst: the writers it held back go on
// for the switch wait before it catches up.
func (r *Rebuilder) gaveWay(ctx context.Context, err error) (reason string, waitFirst bool) {
	if tail, ok := errors.AsType[*tailError](err); ok {
		return tail.Error(), false
	}
	if _, ok := errors.AsType[*sessionEnded](err); ok && ctx.Err() == nil {
		return fmt.Sprintf("its session ended before it committed (PostgreSQL ends it when it paused longer than the "+
			"switch idle timeout, %s, between two statements)", r.cfg.SwitchIdleTimeout), true
	}
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) || ctx.Err() != nil {
		return "", false
	}
	switch pqErr.Code {
	case pqerror.LockNotAvailable:
		return fmt.Sprintf("a lock it needs was held longer than the switch wait (%s)", r.cfg.SwitchWait), true
	case pqerror.QueryCanceled:
		return fmt.Sprintf("a statement of it ran longer than the switch statement timeout (%s)", r.cfg.SwitchStatementTimeout), true
	case pqerror.IdleInTransactionSessionTimeout:
		return fmt.Sprintf("it paused longer than the switch idle timeout (%s) between two statements", r.cfg.SwitchIdleTimeout), true
	}
	return "", false
}

// replicaHolders describes the other sessions that hold a lock on the live
// replica, for the log of a switch that gave way: each one's pid,
// application, state and time in a transaction, never its statement, whose
// text can carry other teams' data. Best effort: an error is described
// instead.
func (r *Rebuilder) replicaHolders(ctx context.Context) []string {
	var out []string
	err := r.cfg.DB.SelectContext(ctx, &out, `SELECT format('pid %s (%s), %s, in a transaction for %s', a.pid,
			coalesce(nullif(a.application_name, ''), 'no application name'), coalesce(a.state, 'no state'),
			date_trunc('second', now() - a.xact_start))
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
		err := r.switchTx(ctx, tx, client, b, cur, log, ends, &copied)
		if connectionLost(err) {
			return &sessionEnded{err} // before the commit: nothing of the switch was committed
		}
		return err
	}, func() { cur.switched.Store(true) })
	return copied, err
}

// switchTx is the switch's statements, in tx; *copied is set to the ends up
// to which it copied the records past ends into the tail.
func (r *Rebuilder) switchTx(ctx context.Context, tx *sqlx.Tx, client *bounded.Client, b boost.Build, cur *run, log *slog.Logger,
	ends map[int32]int64, copied *map[int32]int64) error {
	// Every lock of the switch waits SwitchWait at most, every statement
	// runs SwitchStatementTimeout at most, and every pause between two
	// lasts SwitchIdleTimeout at most: past them the switch rolls back
	// (or PostgreSQL ends its session) and the writers it held back go on.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d; SET LOCAL statement_timeout = %d;
		SET LOCAL idle_in_transaction_session_timeout = %d`, r.cfg.SwitchWait.Milliseconds(),
		r.cfg.SwitchStatementTimeout.Milliseconds(), r.cfg.SwitchIdleTimeout.Milliseconds())); err != nil {
		return fmt.Errorf("bound the switch: %w", err)
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
	if n := records(ranges); n > int64(r.cfg.SwitchMaxRecords) {
		return &tailError{records: n, most: int64(r.cfg.SwitchMaxRecords)}
	}
	cur.progress.Extend(ranges)
	// Copied in transactions of their own, which the switch's reads see.
	n, err := r.copy(ctx, client, b.Tail, ranges, cur, log, "")
	cur.staged.Tail += n
	if err != nil {
		return err
	}
	*copied = next
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
}
