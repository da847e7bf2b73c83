package rebuild

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/boost"
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

// Phase is the step a running rebuild is in (a finished one: the last step it
// began).
type Phase string

// The phases of a rebuild, in order (the package comment says what each does).
const (
	PhaseRead    Phase = "read"
	PhaseLoad    Phase = "load"
	PhaseCompute Phase = "compute"
	PhaseCatchUp Phase = "catch-up"
	PhaseSwitch  Phase = "switch"
)

// Status is the newest rebuild, whichever process or command runs it.
type Status struct {
	ID         string     `json:"id,omitempty" db:"id"`
	State      State      `json:"state" db:"state"`
	Phase      Phase      `json:"phase,omitempty" db:"phase"`
	StartedAt  *time.Time `json:"startedAt,omitempty" db:"started_at"`
	FinishedAt *time.Time `json:"finishedAt,omitempty" db:"finished_at"`
	UpdatedAt  *time.Time `json:"updatedAt,omitempty" db:"updated_at"`
	Counts
	// RefusedRecords names the first records PostgreSQL refused (of
	// Counts.Refused), by partition and offset.
	RefusedRecords refusedRecords `json:"refusedRecords,omitempty" db:"refused_records"`
	Error          string         `json:"error,omitempty" db:"error"`
}

// refusedShown is how many refused records a status names.
const refusedShown = 10

// refusedRecords is the JSON of the refused_records column.
type refusedRecords []boost.Refused

// Scan reads the column's JSON.
func (r *refusedRecords) Scan(src any) error {
	b, ok := src.([]byte)
	if !ok {
		return fmt.Errorf("refused records: want JSON bytes, got %T", src)
	}
	return json.Unmarshal(b, r)
}

// Value writes the column's JSON, as text (sqlmigrate.Open sends []byte
// in binary): an empty list for none.
func (r refusedRecords) Value() (driver.Value, error) {
	if r == nil {
		r = refusedRecords{}
	}
	b, err := json.Marshal(r)
	return string(b), err
}

// Counts is what a rebuild did so far.
type Counts struct {
	// OffsetsDone of OffsetsTotal offsets of the topic are read: those up
	// to the ends recorded at start, then those of each catch-up.
	OffsetsDone  int64 `json:"offsetsDone" db:"offsets_done"`
	OffsetsTotal int64 `json:"offsetsTotal" db:"offsets_total"`
	// Read records, of which Skipped break the contract (the consumer
	// dead-letters them) and Refused have a row PostgreSQL refused to store
	// (the consumer dead-letters them as sql_rejected): both are left out.
	Read    int64 `json:"read" db:"read"`
	Skipped int64 `json:"skipped" db:"skipped"`
	Refused int64 `json:"refused" db:"refused"`
	// Purchases and Contributions of the new replica once loaded.
	Purchases     int64 `json:"purchases" db:"purchases"`
	Contributions int64 `json:"contributions" db:"contributions"`
	// CatchUps is how many catch-ups folded records that arrived during the
	// build; CardsChanged how many cards the switch gave another boost.
	CatchUps     int64 `json:"catchUps" db:"catch_ups"`
	CardsChanged int64 `json:"cardsChanged" db:"cards_changed"`
}

const statusColumns = `id, state, phase, started_at, finished_at, updated_at, offsets_done, offsets_total, read, skipped,
	refused, refused_records, purchases, contributions, catch_ups, cards_changed, error`

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

// saveStatus writes st of the running rebuild st.ID, in q (the database, or
// the switch's transaction), which renews its lease; the outcome once
// st.FinishedAt is set. It returns errLeaseLost when the row is no longer
// running (another rebuild took over).
func saveStatus(ctx context.Context, q sqlx.ExecerContext, st Status) error {
	res, err := q.ExecContext(ctx, `UPDATE catalog.projection_rebuilds SET state = $2, phase = $3, finished_at = $4,
		updated_at = now(), offsets_done = $5, offsets_total = $6, read = $7, skipped = $8, purchases = $9,
		contributions = $10, catch_ups = $11, cards_changed = $12, error = $13, refused = $14, refused_records = $15
		WHERE id = $1 AND state = 'running'`,
		st.ID, st.State, st.Phase, st.FinishedAt, st.OffsetsDone, st.OffsetsTotal, st.Read, st.Skipped, st.Purchases,
		st.Contributions, st.CatchUps, st.CardsChanged, st.Error, st.Refused, st.RefusedRecords)
	if err != nil {
		return fmt.Errorf("record rebuild progress: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return errors.Join(errLeaseLost, err)
	}
	return nil
}

// refusals counts the records whose rows PostgreSQL refused, and keeps the
// first refusedShown of them.
type refusals struct {
	mu    sync.Mutex
	n     int64
	shown refusedRecords
}

func (r *refusals) add(rf boost.Refused) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if len(r.shown) < refusedShown {
		r.shown = append(r.shown, rf)
	}
}

func (r *refusals) snapshot() (int64, refusedRecords) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n, append(refusedRecords(nil), r.shown...)
}
