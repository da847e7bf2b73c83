package purchase

import (
	"cmp"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/handlers/retention"
)

// Idempotency errors.
var (
	// ErrIdempotencyKeyReused: the key was used before with a different request.
	ErrIdempotencyKeyReused = errors.New("idempotency key was used with a different request")
	// ErrIdempotencyKeyExpired: the key reached its retention during the request.
	ErrIdempotencyKeyExpired = errors.New("idempotency key expired")
)

// IdempotencyRetentionDefault is how long an Idempotency-Key is honoured.
const IdempotencyRetentionDefault = 24 * time.Hour

// ServiceConfig configures a Service.
type ServiceConfig struct {
	// Topic is the events' destination topic. Defaults to event.Topic.
	Topic string
	// IdempotencyRetention is how long a key returns its first purchase;
	// after it the key is free again. Defaults to 24h.
	IdempotencyRetention time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Validate reports every out-of-range setting.
func (c ServiceConfig) Validate() error {
	c.setDefaults() // a copy: what the component will run with
	if c.IdempotencyRetention < 0 {
		return errors.New("idempotency key retention must be positive")
	}
	return nil
}

func (c *ServiceConfig) setDefaults() {
	c.Topic = cmp.Or(c.Topic, event.Topic)
	c.IdempotencyRetention = cmp.Or(c.IdempotencyRetention, IdempotencyRetentionDefault)
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Service runs the purchase use cases of the API. Each call is one transaction;
// every status change writes its event to the outbox in that transaction.
type Service struct {
	db  *sqlx.DB
	cfg ServiceConfig
}

// NewService validates cfg (after defaults) and returns a Service on db.
func NewService(db *sqlx.DB, cfg ServiceConfig) (*Service, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Service{db: db, cfg: cfg}, nil
}

// now is in UTC at PostgreSQL's microsecond precision, so that an event built
// from memory equals one built from the stored row.
func (s *Service) now() time.Time { return s.cfg.Now().UTC().Truncate(time.Microsecond) }

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

	err = s.inTx(ctx, "promotion.purchase.create", p, correlationID, func(ctx context.Context, otx *outbox.Tx) error {
		tx := otx.Tx
		if err := InsertTx(ctx, tx, p); err != nil {
			return err
		}
		if idempotencyKey != "" {
			claimed, err := claimKeyTx(ctx, tx, tenant, idempotencyKey, hash, p.ID, s.cfg.IdempotencyRetention)
			if err != nil {
				return err
			}
			if !claimed {
				replayed = true
				return errReplay
			}
		}
		return s.publishTx(ctx, otx, p, correlationID, now)
	})
	if errors.Is(err, errReplay) {
		p, err = s.replay(ctx, tenant, idempotencyKey, hash)
		return p, true, err
	}
	return p, false, err
}

// errReplay rolls back a create whose idempotency key exists already.
var errReplay = errors.New("idempotent replay")

// claimKeyTx records the key, or takes over one older than retention. A
// concurrent request with the same key waits on the primary key until the
// first commits, then sees it taken.
func claimKeyTx(ctx context.Context, tx *sqlx.Tx, tenant uuid.UUID, key string, hash []byte, id uuid.UUID, retention time.Duration) (bool, error) {
	res, err := tx.ExecContext(ctx, `INSERT INTO promotion.idempotency_keys AS k (tenant_id, key, request_hash, purchase_id)
		VALUES ($1, $2, $3, $4)
		ON CONFLICT (tenant_id, key) DO UPDATE SET
			request_hash = excluded.request_hash, purchase_id = excluded.purchase_id, created_at = excluded.created_at
		WHERE k.created_at < now() - make_interval(secs => $5)`, tenant, key, hash, id, retention.Seconds())
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
	err := s.db.GetContext(ctx, &stored, `SELECT request_hash, purchase_id FROM promotion.idempotency_keys
		WHERE tenant_id = $1 AND key = $2 AND created_at >= now() - make_interval(secs => $3)`, tenant, key, s.cfg.IdempotencyRetention.Seconds())
	if errors.Is(err, sql.ErrNoRows) {
		return Purchase{}, fmt.Errorf("idempotency key expired while the request ran; send it again: %w", ErrIdempotencyKeyExpired)
	}
	if err != nil {
		return Purchase{}, fmt.Errorf("read idempotency key: %w", err)
	}
	if string(stored.Hash) != string(hash) {
		return Purchase{}, ErrIdempotencyKeyReused
	}
	return Get(ctx, s.db, tenant, stored.ID)
}

// Cancel moves a tenant's Active or Pending purchase to Cancelled. It waits for
// the row lock, so a racing expirer batch either wins (Cancel then returns
// ErrTerminal with the Expired purchase) or skips the row.
func (s *Service) Cancel(ctx context.Context, tenant, id uuid.UUID, correlationID string) (Purchase, error) {
	var p Purchase
	err := s.inTx(ctx, "promotion.purchase.cancel", Purchase{ID: id, TenantID: tenant}, correlationID, func(ctx context.Context, otx *outbox.Tx) error {
		tx := otx.Tx
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
		return s.publishTx(ctx, otx, p, correlationID, now)
	})
	return p, err
}

// Get reads a tenant's purchase; another tenant's is ErrNotFound.
func (s *Service) Get(ctx context.Context, tenant, id uuid.UUID) (Purchase, error) {
	return Get(ctx, s.db, tenant, id)
}

// List reads a tenant's purchases, optionally of one status.
func (s *Service) List(ctx context.Context, tenant uuid.UUID, status event.Status, limit int) ([]Purchase, error) {
	return List(ctx, s.db, tenant, status, limit)
}

// publishTx writes p's event into the outbox with the span context of ctx,
// the transaction's span: the event's creation context.
func (s *Service) publishTx(ctx context.Context, tx *outbox.Tx, p Purchase, correlationID string, at time.Time) error {
	msg, err := event.NewMessage(p.Event(), correlationID, at)
	if err != nil {
		return err
	}
	event.InjectTrace(ctx, msg)
	return outbox.PublishTx(tx, s.cfg.Topic, msg)
}

// inTx runs fn in a transaction that may write the outbox, under a span
// named name (a child of the request's) that fn's context holds.
func (s *Service) inTx(ctx context.Context, name string, p Purchase, correlationID string, fn func(ctx context.Context, tx *outbox.Tx) error) (err error) {
	ctx, span := tracer.Start(ctx, name, trace.WithAttributes(attribute.String("correlation_id", correlationID),
		attribute.String("purchase.id", p.ID.String()), attribute.String("tenant.id", p.TenantID.String())))
	defer func() {
		if err != nil && !errors.Is(err, errReplay) {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.SetAttributes(attribute.Bool("idempotent_replayed", errors.Is(err, errReplay)))
		span.End()
	}()
	tx, err := outbox.BeginTx(ctx, s.db, nil)
	if err != nil {
		return err
	}
	if err := fn(ctx, tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// tracer names the purchase API's transaction spans; it follows the global provider.
var tracer = otel.Tracer("github.com/promoflow/promoflow/handlers/purchase")

func requestHash(d Draft) ([]byte, error) {
	raw, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("hash request: %w", err)
	}
	sum := sha256.Sum256(raw)
	return sum[:], nil
}

// CleanupIdempotencyKeys deletes the keys older than retention, so that
// promotion.idempotency_keys does not grow without bound. An expired key is
// free for a new purchase even before it is deleted.
func CleanupIdempotencyKeys(ctx context.Context, db *sqlx.DB, keep time.Duration) (int64, error) {
	return retention.Delete(ctx, db, "promotion.idempotency_keys", "created_at", keep)
}
