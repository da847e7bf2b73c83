package rebuild

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/router/bounded"
)

// State is where a rebuild is.
type State string

// The states of a rebuild. A process has no rebuild until one starts (idle).
const (
	StateIdle    State = "idle"
	StateRunning State = "running"
	StateDone    State = "done"
	StateFailed  State = "failed"
)

// Status is the newest rebuild, whichever process or command runs it.
type Status struct {
	ID         string     `json:"id,omitempty" db:"id"`
	State      State      `json:"state" db:"state"`
	StartedAt  *time.Time `json:"startedAt,omitempty" db:"started_at"`
	FinishedAt *time.Time `json:"finishedAt,omitempty" db:"finished_at"`
	UpdatedAt  *time.Time `json:"updatedAt,omitempty" db:"updated_at"`
	// OffsetsDone of OffsetsTotal offsets of the topic are replayed.
	OffsetsDone  int64 `json:"offsetsDone" db:"offsets_done"`
	OffsetsTotal int64 `json:"offsetsTotal" db:"offsets_total"`
	// Read records, of which Applied went through the consumer chain,
	// Duplicates were acked as duplicates (the live consumer applied them
	// after the reset, and their effect was kept), and Skipped failed for
	// good (a contract violation, dead-lettered already).
	Read       int64  `json:"read" db:"read"`
	Applied    int64  `json:"applied" db:"applied"`
	Duplicates int64  `json:"duplicates" db:"duplicates"`
	Skipped    int64  `json:"skipped" db:"skipped"`
	Error      string `json:"error,omitempty" db:"error"`
}

const statusColumns = `id, state, started_at, finished_at, updated_at, offsets_done, offsets_total, read, applied, duplicates, skipped, error`

// newest reads the newest rebuild. A running one whose progress is older than
// staleAfter lost its process: it is reported failed.
func newest(ctx context.Context, db *sqlx.DB, staleAfter time.Duration) (Status, error) {
	var st Status
	err := db.GetContext(ctx, &st, `SELECT `+statusColumns+` FROM catalog.projection_rebuilds ORDER BY started_at DESC LIMIT 1`)
	if errors.Is(err, sql.ErrNoRows) {
		return Status{State: StateIdle}, nil
	}
	if err != nil {
		return Status{}, fmt.Errorf("read rebuild status: %w", err)
	}
	if st.State == StateRunning && st.UpdatedAt != nil && time.Since(*st.UpdatedAt) > staleAfter {
		st.State = StateFailed
		st.Error = fmt.Sprintf("abandoned: no progress since %s (its process stopped); start a new rebuild",
			st.UpdatedAt.UTC().Format(time.RFC3339))
	}
	return st, nil
}

// saveStatus writes the progress of the running rebuild id, which renews its
// lease, and the outcome once finished is set. It returns errLeaseLost when
// the row is no longer running (another rebuild took over).
func saveStatus(ctx context.Context, db *sqlx.DB, id string, state State, c bounded.Counts, finished *time.Time, errText string) error {
	res, err := db.ExecContext(ctx, `UPDATE catalog.projection_rebuilds SET state = $2, finished_at = $3, updated_at = now(),
		offsets_done = $4, offsets_total = $5, read = $6, applied = $7, skipped = $8, error = $9, duplicates = $10 WHERE id = $1 AND state = 'running'`,
		id, state, finished, c.OffsetsDone, c.OffsetsTotal, c.Read, c.Replayed, c.Skipped, errText, c.Duplicates)
	if err != nil {
		return fmt.Errorf("record rebuild progress: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return errors.Join(errLeaseLost, err)
	}
	return nil
}
