package expire

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/handlers/purchase"
)

type batchResult struct {
	selected, expired, poison int
	delays                    []time.Duration
}

// batch is one transaction. It runs on a context that shutdown does not cancel,
// bounded by BatchTimeout, so that it commits or rolls back whole. Its span,
// a child of the cycle's, is the creation context of every event it writes.
func (e *Expirer) batch(parent context.Context, log *slog.Logger, res Result, poison map[uuid.UUID]bool) (b batchResult, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), e.cfg.BatchTimeout)
	defer cancel()
	ctx, span := tracer.Start(ctx, "promotion.expire.batch", trace.WithAttributes(attribute.String("correlation_id", res.RunID)))
	defer func() {
		span.SetAttributes(attribute.Int("selected_count", b.selected), attribute.Int("expired_count", b.expired),
			attribute.Int("poison_count", b.poison))
		endSpan(span, err)
	}()

	tx, err := outbox.BeginTx(ctx, e.db, nil)
	if err != nil {
		return batchResult{}, fmt.Errorf("begin batch: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit

	rows, err := purchase.SelectDueTx(ctx, tx.Tx, res.AsOf, e.cfg.BatchSize, keys(poison))
	if err != nil {
		return batchResult{}, err
	}
	log.Info("batch selected", "count", len(rows))

	due := make([]purchase.Purchase, 0, len(rows))
	for _, r := range rows {
		p, err := r.Decode()
		if err == nil {
			err = p.Check()
		}
		if err == nil {
			err = p.Expire(res.AsOf)
		}
		if err != nil {
			// Poison: left Active for the next cycle, never retried in this one,
			// so it cannot starve healthy rows behind it.
			poison[r.ID] = true
			log.Error("item failed", "PurchaseId", r.ID, "exception", err.Error())
			continue
		}
		due = append(due, p)
	}
	b = batchResult{selected: len(rows), poison: len(rows) - len(due)}
	if len(due) == 0 {
		return b, tx.Commit()
	}

	expired, failed, err := expireIsolated(ctx, tx.Tx, due)
	if err != nil {
		return batchResult{}, err
	}
	for _, f := range failed {
		poison[f.id] = true
		log.Error("item failed", "PurchaseId", f.id, "exception", f.err.Error())
	}
	b.poison += len(failed)
	msgs := make([]*message.Message, 0, len(expired))
	for _, p := range expired {
		msg, err := event.NewMessage(p.Event(), res.RunID, res.AsOf)
		if err != nil {
			return batchResult{}, err
		}
		event.InjectTrace(ctx, msg)
		msgs = append(msgs, msg)
	}
	if len(msgs) > 0 {
		if err := outbox.PublishTx(tx, e.cfg.Topic, msgs...); err != nil {
			return batchResult{}, err
		}
	}
	if err := tx.Commit(); err != nil {
		return batchResult{}, fmt.Errorf("commit batch: %w", err)
	}
	for _, p := range expired {
		log.Info("promotion expired", "PurchaseId", p.ID, "TenantId", p.TenantID,
			"PackageKind", p.PackageKind, "targets", len(p.Targets))
		b.delays = append(b.delays, res.AsOf.Sub(p.EndsAt))
	}
	b.expired = len(expired)
	return b, nil
}

// rowFailure is a purchase whose own transition SQL failed.
type rowFailure struct {
	id  uuid.UUID
	err error
}

// expireIsolated writes the transitions of due, isolating the rows whose SQL
// fails for a reason of their own: a data or constraint error (say, a version
// at the bigint limit that version + 1 overflows) rolls back to a savepoint
// and the set is split in halves until the failing rows stand alone. They are
// poison; the rest commit, so a failing row never starves the healthy ones
// behind it. Any other error (the connection, a timeout) fails the batch.
func expireIsolated(ctx context.Context, tx *sqlx.Tx, due []purchase.Purchase) ([]purchase.Purchase, []rowFailure, error) {
	var expired []purchase.Purchase
	var failed []rowFailure
	var walk func(set []purchase.Purchase) error
	walk = func(set []purchase.Purchase) error {
		got, err := saveSavepoint(ctx, tx, set)
		switch {
		case err == nil:
			expired = append(expired, got...)
			return nil
		case !rowSpecific(err):
			return err
		case len(set) == 1:
			failed = append(failed, rowFailure{set[0].ID, err})
			return nil
		}
		mid := len(set) / 2
		if err := walk(set[:mid]); err != nil {
			return err
		}
		return walk(set[mid:])
	}
	return expired, failed, walk(due)
}

// rowSpecific reports an error that the data of the rows caused: SQLSTATE
// class 22 (data exception) or 23 (integrity constraint violation).
func rowSpecific(err error) bool {
	var pqErr *pq.Error
	return errors.As(err, &pqErr) && (pqErr.Code.Class() == "22" || pqErr.Code.Class() == "23")
}

// saveSavepoint writes the transitions of set under a savepoint, so that a
// failure leaves the batch's transaction usable.
func saveSavepoint(ctx context.Context, tx *sqlx.Tx, set []purchase.Purchase) ([]purchase.Purchase, error) {
	if _, err := tx.ExecContext(ctx, `SAVEPOINT expire_set`); err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	got, err := purchase.SaveTransitionsTx(ctx, tx, set)
	if err != nil {
		if _, rbErr := tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT expire_set`); rbErr != nil {
			return nil, errors.Join(err, fmt.Errorf("roll back to savepoint: %w", rbErr))
		}
	}
	if _, relErr := tx.ExecContext(ctx, `RELEASE SAVEPOINT expire_set`); relErr != nil {
		return nil, errors.Join(err, fmt.Errorf("release savepoint: %w", relErr))
	}
	return got, err
}
