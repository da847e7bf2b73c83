package boost

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// CardCheck is the outcome of the newest check of every card's boost against
// the replica (Drift), whoever ran it: the catalog's periodic audit or
// `promoflow audit`. It outlives the process, so that `promoflow status`
// reads the drift without asking one.
type CardCheck struct {
	// Checked cards, of which Drifted still differ from the replica's sum
	// (after any repair of that run); Samples names the first of them.
	Checked int64       `json:"checked"`
	Drifted int         `json:"drifted"`
	Samples []CardDrift `json:"samples,omitempty"`
	// Source is what ran the check: "catalog" (the periodic audit) or "audit".
	Source string `json:"source"`
	// CheckedAt is when it was recorded, and Age how long ago, by the
	// database's clock; both set on read.
	CheckedAt time.Time     `json:"checkedAt"`
	Age       time.Duration `json:"-"`
}

// RecordCardCheck writes c as the newest card check.
func RecordCardCheck(ctx context.Context, q sqlx.ExecerContext, c CardCheck) error {
	samples, err := json.Marshal(c.Samples)
	if err != nil {
		return fmt.Errorf("record the card check: %w", err)
	}
	if c.Samples == nil {
		samples = []byte("[]")
	}
	_, err = q.ExecContext(ctx, `INSERT INTO catalog.card_check (checked_at, checked, drifted, samples, source)
		VALUES (now(), $1, $2, $3::text::jsonb, $4)
		ON CONFLICT (singleton) DO UPDATE SET checked_at = EXCLUDED.checked_at, checked = EXCLUDED.checked,
			drifted = EXCLUDED.drifted, samples = EXCLUDED.samples, source = EXCLUDED.source`,
		c.Checked, c.Drifted, string(samples), c.Source)
	if err != nil {
		return fmt.Errorf("record the card check: %w", err)
	}
	return nil
}

// ReadCardCheck reads the newest card check; found is false when none was
// ever recorded.
func ReadCardCheck(ctx context.Context, q sqlx.QueryerContext) (c CardCheck, found bool, err error) {
	var row struct {
		CheckedAt time.Time `db:"checked_at"`
		Checked   int64     `db:"checked"`
		Drifted   int       `db:"drifted"`
		Samples   string    `db:"samples"`
		Source    string    `db:"source"`
		AgeSecs   float64   `db:"age_seconds"`
	}
	err = sqlx.GetContext(ctx, q, &row, `SELECT checked_at, checked, drifted, samples::text AS samples, source,
		EXTRACT(EPOCH FROM now() - checked_at)::float8 AS age_seconds FROM catalog.card_check`)
	if errors.Is(err, sql.ErrNoRows) {
		return CardCheck{}, false, nil
	}
	if err != nil {
		return CardCheck{}, false, fmt.Errorf("read the card check: %w", err)
	}
	c = CardCheck{Checked: row.Checked, Drifted: row.Drifted, Source: row.Source, CheckedAt: row.CheckedAt,
		Age: time.Duration(row.AgeSecs * float64(time.Second))}
	if err := json.Unmarshal([]byte(row.Samples), &c.Samples); err != nil {
		return CardCheck{}, false, fmt.Errorf("read the card check's samples: %w", err)
	}
	return c, true, nil
}
