package purchase

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/outbox"
)

// A phantom is a purchase whose newest event on the topic is a version the
// database does not hold: after an asynchronous failover, the relay had
// published changes that the promoted standby never received. Reconcile
// writes the database's truth over it at the topic's version + 1, so that
// the catalog (which applies only versions at or above the one it stores)
// takes it: the row's version jumps past the topic's, the one exception to
// INV-6's one-increment-per-transition (docs/architecture.md, "Reconcile
// after a failover").

// Phantom kinds.
const (
	// PhantomMissing is a purchase on the topic that the database lacks: it
	// becomes a Cancelled row, so that its boost ends in the catalog.
	PhantomMissing = "missing"
	// PhantomBehind is a purchase the database holds at a lower version than
	// the topic: its row's state is published again at the jumped version.
	PhantomBehind = "behind"
)

// MissingReason is why Reconcile creates a Cancelled row for a purchase the
// database lacks.
const MissingReason = "on the purchase topic but not in the database (lost in a failover): cancelled so that its boost ends"

// Repair is what Reconcile did to one purchase.
type Repair struct {
	ID uuid.UUID
	// Kind is PhantomMissing or PhantomBehind; empty when the database
	// holds the topic's version or a later one, and nothing was written.
	Kind string
	// TopicVersion is the newest version on the topic.
	TopicVersion int64
	// Purchase is the row as written, at TopicVersion + 1.
	Purchase Purchase
}

// Versions reads the stored version of each of ids that the database holds.
func Versions(ctx context.Context, q sqlx.QueryerContext, ids []uuid.UUID) (map[uuid.UUID]int64, error) {
	var rows []struct {
		ID      uuid.UUID `db:"id"`
		Version int64     `db:"version"`
	}
	if err := sqlx.SelectContext(ctx, q, &rows, `SELECT id, version FROM promotion.promotion_purchases WHERE id = ANY($1::uuid[])`,
		pq.Array(uuidStrings(ids))); err != nil {
		return nil, fmt.Errorf("read purchase versions: %w", err)
	}
	out := make(map[uuid.UUID]int64, len(rows))
	for _, r := range rows {
		out[r.ID] = r.Version
	}
	return out, nil
}

// Reconcile compares a purchase's newest event on the topic with its row,
// under the row's lock, and when the row lacks that version writes the
// database's truth through the outbox at the topic's version + 1: a missing
// purchase as a Cancelled row built from the event, a row behind the topic
// as it stands. A purchase the database holds at the topic's version or
// later is left alone, so a second run writes nothing.
func (s *Service) Reconcile(ctx context.Context, onTopic event.PurchaseChanged, correlationID string) (Repair, error) {
	r := Repair{ID: onTopic.PurchaseId, TopicVersion: onTopic.Version}
	err := s.inTx(ctx, "promotion.purchase.reconcile", Purchase{ID: onTopic.PurchaseId, TenantID: onTopic.TenantId}, correlationID,
		func(ctx context.Context, otx *outbox.Tx) error {
			now := s.now()
			p, found, err := lockAnyTx(ctx, otx.Tx, onTopic.PurchaseId)
			switch {
			case err != nil:
				return err
			case !found:
				r.Kind, p = PhantomMissing, fromEvent(onTopic, now)
			case p.Version >= onTopic.Version:
				return nil
			default:
				r.Kind = PhantomBehind
			}
			stored := p.Version
			p.Version, p.UpdatedAt = onTopic.Version+1, now
			if r.Kind == PhantomMissing {
				err = InsertTx(ctx, otx.Tx, p)
			} else {
				err = jumpVersionTx(ctx, otx.Tx, p, stored)
			}
			if err != nil {
				return err
			}
			r.Purchase = p
			return s.publishTx(ctx, otx, p, correlationID, now)
		})
	if err != nil {
		return Repair{ID: onTopic.PurchaseId, TopicVersion: onTopic.Version}, err
	}
	return r, nil
}

// fromEvent is the Cancelled row of a purchase known only from its event.
func fromEvent(ev event.PurchaseChanged, now time.Time) Purchase {
	return Purchase{ID: ev.PurchaseId, TenantID: ev.TenantId, PackageKind: ev.PackageKind, Targets: ev.Targets,
		BoostWeight: ev.BoostWeight, Status: event.StatusCancelled, PaymentStatus: ev.PaymentStatus,
		StartsAt: ev.StartsAt.UTC(), EndsAt: ev.EndsAt.UTC(), CreatedAt: now, UpdatedAt: now, Version: ev.Version}
}

// lockAnyTx reads a purchase of any tenant and locks its row; found is false
// when there is none.
func lockAnyTx(ctx context.Context, tx *sqlx.Tx, id uuid.UUID) (p Purchase, found bool, err error) {
	var r Row
	err = tx.GetContext(ctx, &r, `SELECT `+Columns+` FROM promotion.promotion_purchases WHERE id = $1 FOR UPDATE`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return Purchase{}, false, nil
	}
	if err != nil {
		return Purchase{}, false, fmt.Errorf("lock purchase: %w", err)
	}
	p, err = r.Decode()
	return p, err == nil, err
}

// jumpVersionTx sets p's version and updated_at on its row, if the row
// still holds version from.
func jumpVersionTx(ctx context.Context, tx *sqlx.Tx, p Purchase, from int64) error {
	res, err := tx.ExecContext(ctx, `UPDATE promotion.promotion_purchases SET version = $2, updated_at = $3
		WHERE id = $1 AND version = $4`, p.ID, p.Version, p.UpdatedAt, from)
	if err != nil {
		return fmt.Errorf("update purchase version: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("update purchase %s version: %w", p.ID, ErrVersionConflict)
	}
	return nil
}
