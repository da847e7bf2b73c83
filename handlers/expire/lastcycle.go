package expire

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// LastCycle is the newest expirer cycle of any process, as it recorded
// itself in promotion.expirer_last_cycle: what `promoflow status` reads
// without asking a process.
type LastCycle struct {
	RunID        string    `db:"run_id" json:"runId"`
	AsOf         time.Time `db:"as_of" json:"AsOf"`
	ExpiredCount int       `db:"expired_count" json:"ExpiredCount"`
	PoisonCount  int       `db:"poison_count" json:"poisonCount"`
	Backlog      int       `db:"backlog" json:"backlog"`
	DurationMs   int64     `db:"duration_ms" json:"DurationMs"`
	// Error is the failure of that cycle; empty when it did not fail.
	Error string `db:"error" json:"error,omitempty"`
	// Interval is its process's time between cycles.
	Interval time.Duration `db:"-" json:"-"`
	// Age is how long ago it ended, and OKAge how long ago the newest cycle
	// that did not fail ended (-1: none did), both by the database's clock.
	Age   time.Duration `db:"-" json:"-"`
	OKAge time.Duration `db:"-" json:"-"`
}

// Record writes the cycle res (cycleErr its failure, or nil) as the newest,
// unless a newer one of another process is there already. A cycle that
// failed keeps the time of the last one that did not.
func (e *Expirer) Record(ctx context.Context, res Result, cycleErr error) error {
	if res.RunID == "" || res.AsOf.IsZero() {
		return nil // it never read the clock: the database did not answer
	}
	msg := ""
	if cycleErr != nil {
		msg = cycleErr.Error()
	}
	_, err := e.db.ExecContext(ctx, `INSERT INTO promotion.expirer_last_cycle AS l (run_id, as_of, finished_at, interval_ms,
			expired_count, poison_count, backlog, duration_ms, error, last_ok_at)
		VALUES ($1, $2, now(), $3, $4, $5, $6, $7, $8, CASE WHEN $8 = '' THEN now() END)
		ON CONFLICT (singleton) DO UPDATE SET run_id = EXCLUDED.run_id, as_of = EXCLUDED.as_of,
			finished_at = EXCLUDED.finished_at, interval_ms = EXCLUDED.interval_ms, expired_count = EXCLUDED.expired_count,
			poison_count = EXCLUDED.poison_count, backlog = EXCLUDED.backlog, duration_ms = EXCLUDED.duration_ms,
			error = EXCLUDED.error, last_ok_at = coalesce(EXCLUDED.last_ok_at, l.last_ok_at)
		WHERE l.finished_at <= EXCLUDED.finished_at`,
		res.RunID, res.AsOf, e.cfg.Interval.Milliseconds(), res.ExpiredCount, res.PoisonCount, res.Backlog,
		res.Duration.Milliseconds(), msg)
	if err != nil {
		return fmt.Errorf("record the expirer cycle: %w", err)
	}
	return nil
}

// ReadLastCycle reads the newest recorded cycle; found is false when no
// cycle was ever recorded.
func ReadLastCycle(ctx context.Context, q sqlx.QueryerContext) (c LastCycle, found bool, err error) {
	var row struct {
		LastCycle
		IntervalMs int64   `db:"interval_ms"`
		AgeSecs    float64 `db:"age_seconds"`
		OKAgeSecs  float64 `db:"ok_age_seconds"`
	}
	err = sqlx.GetContext(ctx, q, &row, `SELECT run_id, as_of, expired_count, poison_count, backlog, duration_ms, error,
		interval_ms, EXTRACT(EPOCH FROM now() - finished_at)::float8 AS age_seconds,
		coalesce(EXTRACT(EPOCH FROM now() - last_ok_at)::float8, -1) AS ok_age_seconds
		FROM promotion.expirer_last_cycle`)
	if errors.Is(err, sql.ErrNoRows) {
		return LastCycle{}, false, nil
	}
	if err != nil {
		return LastCycle{}, false, fmt.Errorf("read the expirer's last cycle: %w", err)
	}
	c = row.LastCycle
	c.Interval = time.Duration(row.IntervalMs) * time.Millisecond
	c.Age = seconds(row.AgeSecs)
	c.OKAge = seconds(row.OKAgeSecs)
	return c, true, nil
}

func seconds(s float64) time.Duration {
	if s < 0 {
		return -1
	}
	return time.Duration(s * float64(time.Second))
}
