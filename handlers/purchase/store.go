package purchase

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/event"
)

// Columns is the select list that Row scans.
const Columns = `id, tenant_id, package_kind, targets, boost_weight, status, payment_status,
	starts_at, ends_at, created_at, updated_at, version`

// Row is a stored purchase before its targets are decoded. Decoding can fail on
// a row written outside the API: the expirer treats that row as poison.
type Row struct {
	Purchase
	RawTargets []byte `db:"targets"`
}

// Decode returns the purchase with its targets.
func (r Row) Decode() (Purchase, error) {
	p := r.Purchase
	if err := json.Unmarshal(r.RawTargets, &p.Targets); err != nil {
		return p, fmt.Errorf("decode targets of %s: %w", p.ID, err)
	}
	p.StartsAt, p.EndsAt = p.StartsAt.UTC(), p.EndsAt.UTC()
	p.CreatedAt, p.UpdatedAt = p.CreatedAt.UTC(), p.UpdatedAt.UTC()
	return p, nil
}

func decodeAll(rows []Row) ([]Purchase, error) {
	out := make([]Purchase, 0, len(rows))
	for _, r := range rows {
		p, err := r.Decode()
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// InsertTx stores a new purchase in the caller's transaction.
func InsertTx(ctx context.Context, tx *sqlx.Tx, p Purchase) error {
	targets, err := json.Marshal(p.Targets)
	if err != nil {
		return fmt.Errorf("encode targets: %w", err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO promotion.promotion_purchases (`+Columns+`)
		VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12)`,
		p.ID, p.TenantID, p.PackageKind, targets, p.BoostWeight, p.Status, p.PaymentStatus,
		p.StartsAt, p.EndsAt, p.CreatedAt, p.UpdatedAt, p.Version)
	if err != nil {
		return fmt.Errorf("insert purchase: %w", err)
	}
	return nil
}

// LockTx reads a tenant's purchase and locks its row until the transaction ends.
// It waits for a lock held elsewhere (the expirer's batch), then sees the
// committed state.
func LockTx(ctx context.Context, tx *sqlx.Tx, tenant, id uuid.UUID) (Purchase, error) {
	var r Row
	err := tx.GetContext(ctx, &r, `SELECT `+Columns+` FROM promotion.promotion_purchases
		WHERE id = $1 AND tenant_id = $2 FOR UPDATE`, id, tenant)
	if errors.Is(err, sql.ErrNoRows) {
		return Purchase{}, ErrNotFound
	}
	if err != nil {
		return Purchase{}, fmt.Errorf("lock purchase: %w", err)
	}
	return r.Decode()
}

// SaveTransitionTx writes a transition made by Expire or Cancel. The version
// guard turns a concurrent change into ErrVersionConflict.
func SaveTransitionTx(ctx context.Context, tx *sqlx.Tx, p Purchase) error {
	res, err := tx.ExecContext(ctx, `UPDATE promotion.promotion_purchases
		SET status = $1, updated_at = $2, version = $3
		WHERE id = $4 AND version = $5`, p.Status, p.UpdatedAt, p.Version, p.ID, p.Version-1)
	if err != nil {
		return fmt.Errorf("update purchase: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("update purchase: %w", err)
	}
	if n != 1 {
		return fmt.Errorf("update purchase %s: %w", p.ID, ErrVersionConflict)
	}
	return nil
}

// Get reads one purchase of a tenant.
func Get(ctx context.Context, q sqlx.QueryerContext, tenant, id uuid.UUID) (Purchase, error) {
	var r Row
	err := sqlx.GetContext(ctx, q, &r, `SELECT `+Columns+` FROM promotion.promotion_purchases
		WHERE id = $1 AND tenant_id = $2`, id, tenant)
	if errors.Is(err, sql.ErrNoRows) {
		return Purchase{}, ErrNotFound
	}
	if err != nil {
		return Purchase{}, fmt.Errorf("get purchase: %w", err)
	}
	return r.Decode()
}

// List reads a tenant's purchases, newest first, optionally of one status.
func List(ctx context.Context, q sqlx.QueryerContext, tenant uuid.UUID, status event.Status, limit int) ([]Purchase, error) {
	var rows []Row
	err := sqlx.SelectContext(ctx, q, &rows, `SELECT `+Columns+` FROM promotion.promotion_purchases
		WHERE tenant_id = $1 AND ($2 = '' OR status = $2)
		ORDER BY created_at DESC, id LIMIT $3`, tenant, string(status), limit)
	if err != nil {
		return nil, fmt.Errorf("list purchases: %w", err)
	}
	return decodeAll(rows)
}
