package expire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
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
func (e *Expirer) batch(parent context.Context, log *slog.Logger, res Result, scan *dueScan) (b batchResult, err error) {
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

	from, exclude := scan.next()
	rows, err := purchase.SelectDueTx(ctx, tx.Tx, res.AsOf, from, e.cfg.BatchSize, exclude)
	if err != nil {
		return batchResult{}, err
	}
	log.Info("batch selected", "count", len(rows))

	due := make([]purchase.Purchase, 0, len(rows))
	b = batchResult{selected: len(rows)}
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
			if scan.addPoison(r.ID) {
				b.poison++
				log.Error("item failed", "PurchaseId", r.ID, "exception", err.Error())
			}
			continue
		}
		due = append(due, p)
	}
	if len(due) == 0 {
		if err := tx.Commit(); err != nil {
			return batchResult{}, fmt.Errorf("commit batch: %w", err)
		}
		scan.advance(rows)
		return b, nil
	}

	expired, failed, err := expireIsolated(ctx, tx.Tx, due)
	if err != nil {
		return batchResult{}, err
	}
	for _, f := range failed {
		if scan.addPoison(f.id) {
			b.poison++
			log.Error("item failed", "PurchaseId", f.id, "exception", f.err.Error())
		}
	}
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
	scan.advance(rows)
	for _, p := range expired {
		log.Info("promotion expired", "PurchaseId", p.ID, "TenantId", p.TenantID,
			"PackageKind", p.PackageKind, "targets", len(p.Targets))
		b.delays = append(b.delays, res.AsOf.Sub(p.EndsAt))
	}
	b.expired = len(expired)
	return b, nil
}

// dueScan is where a cycle's next batch starts: past the poison rows it met,
// and past the last row a committed batch selected. Rows before that which
// were locked elsewhere when the scan passed them (by another instance, or
// by an in-flight cancel that then rolled back) are the next cycle's, as rows
// skipped by SKIP LOCKED always were. The cycle's batches share it.
type dueScan struct {
	mu     sync.Mutex
	poison map[uuid.UUID]bool
	from   purchase.DueCursor
}

func newDueScan() *dueScan { return &dueScan{poison: map[uuid.UUID]bool{}} }

// next is where the next batch starts and the rows it leaves out.
func (s *dueScan) next() (purchase.DueCursor, []uuid.UUID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.from, keys(s.poison)
}

// addPoison reports whether id is new to the cycle's poison rows: a batch
// beside the one that met it may have read the scan's start before it was
// added and select it again once that batch's locks are gone.
func (s *dueScan) addPoison(id uuid.UUID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.poison[id] {
		return false
	}
	s.poison[id] = true
	return true
}

// poisonIDs are the poison rows met so far.
func (s *dueScan) poisonIDs() []uuid.UUID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return keys(s.poison)
}

// advance moves the scan past rows, which a committed batch selected in
// (EndsAt, Id) order, unless a batch that ran beside it went further.
func (s *dueScan) advance(rows []purchase.Row) {
	if len(rows) == 0 {
		return
	}
	last := rows[len(rows)-1]
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := last.EndsAt.Compare(s.from.EndsAt); c > 0 || c == 0 && bytes.Compare(last.ID[:], s.from.ID[:]) > 0 {
		s.from = purchase.DueCursor{EndsAt: last.EndsAt, ID: last.ID}
	}
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
