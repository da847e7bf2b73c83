package purchase

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// Due is what the expirer has left to do now, by the database's clock: the
// Active purchases past their EndsAt, and the one that has waited longest.
type Due struct {
	Count int `db:"count" json:"count"`
	// Oldest is the PurchaseId of the due purchase with the earliest EndsAt,
	// empty when none is due; OldestEndsAt its EndsAt and OldestAge how far
	// past it the database's clock is.
	Oldest       string        `db:"oldest" json:"oldest,omitempty"`
	OldestEndsAt *time.Time    `db:"oldest_ends_at" json:"oldestEndsAt,omitempty"`
	OldestAge    time.Duration `db:"-" json:"-"`
}

// ReadDue counts the due purchases through promotion_purchases_due_id_idx.
func ReadDue(ctx context.Context, q sqlx.QueryerContext) (Due, error) {
	var row struct {
		Due
		AgeSecs float64 `db:"age_seconds"`
	}
	err := sqlx.GetContext(ctx, q, &row, `WITH due AS (
			SELECT id, ends_at FROM promotion.promotion_purchases WHERE status = 'Active' AND ends_at <= now()
		), oldest AS (SELECT id, ends_at FROM due ORDER BY ends_at LIMIT 1)
		SELECT (SELECT count(*) FROM due) AS count, coalesce((SELECT id::text FROM oldest), '') AS oldest,
			(SELECT ends_at FROM oldest) AS oldest_ends_at,
			coalesce(EXTRACT(EPOCH FROM now() - (SELECT ends_at FROM oldest))::float8, 0) AS age_seconds`)
	if err != nil {
		return Due{}, fmt.Errorf("read the due purchases: %w", err)
	}
	row.Due.OldestAge = time.Duration(row.AgeSecs * float64(time.Second))
	return row.Due, nil
}
