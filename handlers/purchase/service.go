package purchase

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/outbox"
)

// ErrIdempotencyKeyReused: the key was used before with a different request.
var ErrIdempotencyKeyReused = errors.New("idempotency key was used with a different request")

// Service runs the purchase use cases of the API. Each call is one transaction;
// every status change writes its event to the outbox in that transaction.
type Service struct {
	DB *sqlx.DB
	// Topic is the event's destination topic. Defaults to event.Topic.
	Topic string
	// Now is the clock. Defaults to time.Now in UTC.
	Now func() time.Time
}

// now is in UTC at PostgreSQL's microsecond precision, so that an event built
// from memory equals one built from the stored row.
func (s *Service) now() time.Time {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	return now().UTC().Truncate(time.Microsecond)
}

func (s *Service) topic() string {
	if s.Topic != "" {
		return s.Topic
	}
	return event.Topic
}

// Create validates d and stores a purchase that is Active at once (no-payment
// mode), with its Active event. With a non-empty idempotencyKey, a repeat of the
// same request returns the first purchase and replayed = true. A zero StartsAt
// means now.
func (s *Service) Create(ctx context.Context, tenant uuid.UUID, idempotencyKey string, d Draft, correlationID string) (p Purchase, replayed bool, err error) {
	// The hash is of the request as sent, before defaults, so a retry matches.
	hash, err := requestHash(d)
	if err != nil {
		return Purchase{}, false, err
	}
	now := s.now()
	if d.StartsAt.IsZero() {
		d.StartsAt = now
	}
	if err := d.Validate(); err != nil {
		return Purchase{}, false, err
	}
	p = NewActive(uuid.New(), tenant, d, now)

	err = s.inTx(ctx, func(tx *sqlx.Tx) error {
		if err := InsertTx(ctx, tx, p); err != nil {
			return err
		}
		if idempotencyKey != "" {
			claimed, err := claimKeyTx(ctx, tx, tenant, idempotencyKey, hash, p.ID)
			if err != nil {
				return err
			}
			if !claimed {
				replayed = true
				return errReplay
			}
		}
		return s.publishTx(tx, p, correlationID, now)
	})
	if errors.Is(err, errReplay) {
		p, err = s.replay(ctx, tenant, idempotencyKey, hash)
		return p, true, err
	}
	return p, false, err
}

// errReplay rolls back a create whose idempotency key exists already.
var errReplay = errors.New("idempotent replay")

// claimKeyTx records the key. A concurrent request with the same key waits on
// the primary key until the first commits, then sees it taken.
func claimKeyTx(ctx context.Context, tx *sqlx.Tx, tenant uuid.UUID, key string, hash []byte, id uuid.UUID) (bool, error) {
	res, err := tx.ExecContext(ctx, `INSERT INTO promotion.idempotency_keys (tenant_id, key, request_hash, purchase_id)
		VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`, tenant, key, hash, id)
	if err != nil {
		return false, fmt.Errorf("claim idempotency key: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("claim idempotency key: %w", err)
	}
	return n == 1, nil
}

func (s *Service) replay(ctx context.Context, tenant uuid.UUID, key string, hash []byte) (Purchase, error) {
	var stored struct {
		Hash []byte    `db:"request_hash"`
		ID   uuid.UUID `db:"purchase_id"`
	}
	err := s.DB.GetContext(ctx, &stored, `SELECT request_hash, purchase_id FROM promotion.idempotency_keys
		WHERE tenant_id = $1 AND key = $2`, tenant, key)
	if err != nil {
		return Purchase{}, fmt.Errorf("read idempotency key: %w", err)
	}
	if string(stored.Hash) != string(hash) {
		return Purchase{}, ErrIdempotencyKeyReused
	}
	return Get(ctx, s.DB, tenant, stored.ID)
}

// Cancel moves a tenant's Active or Pending purchase to Cancelled. It waits for
// the row lock, so a racing expirer batch either wins (Cancel then returns
// ErrTerminal with the Expired purchase) or skips the row.
func (s *Service) Cancel(ctx context.Context, tenant, id uuid.UUID, correlationID string) (Purchase, error) {
	var p Purchase
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		var err error
		if p, err = LockTx(ctx, tx, tenant, id); err != nil {
			return err
		}
		now := s.now()
		if err := p.Cancel(now); err != nil {
			return err
		}
		if err := SaveTransitionTx(ctx, tx, p); err != nil {
			return err
		}
		return s.publishTx(tx, p, correlationID, now)
	})
	return p, err
}

// Get reads a tenant's purchase; another tenant's is ErrNotFound.
func (s *Service) Get(ctx context.Context, tenant, id uuid.UUID) (Purchase, error) {
	return Get(ctx, s.DB, tenant, id)
}

// List reads a tenant's purchases, optionally of one status.
func (s *Service) List(ctx context.Context, tenant uuid.UUID, status event.Status, limit int) ([]Purchase, error) {
	return List(ctx, s.DB, tenant, status, limit)
}

func (s *Service) publishTx(tx *sqlx.Tx, p Purchase, correlationID string, at time.Time) error {
	msg, err := event.NewMessage(p.Event(), correlationID, at)
	if err != nil {
		return err
	}
	return outbox.PublishTx(tx, s.topic(), msg)
}

func (s *Service) inTx(ctx context.Context, fn func(tx *sqlx.Tx) error) error {
	tx, err := s.DB.BeginTxx(ctx, &sql.TxOptions{})
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

func requestHash(d Draft) ([]byte, error) {
	raw, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("hash request: %w", err)
	}
	sum := sha256.Sum256(raw)
	return sum[:], nil
}
