package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// The write freeze (migration 0016): while its row exists, every outbox
// writer refuses to begin (BeginTx: promotion.outbox_writable), so the
// purchase API answers 503 and the expirer pauses, while the relay goes on
// publishing. A cutover drains the outbox under it (`promoflow outbox
// drain`), switches, and lifts it (`promoflow outbox thaw`).

// FreezeTable holds the write freeze in force, at most one row.
const FreezeTable = "promotion.write_freeze"

// ErrNoFreezeTable is a database whose schema predates the write freeze.
var ErrNoFreezeTable = errors.New("the database has no write freeze table (migration 0016_write_freeze): run `promoflow migrate up` first")

// Freeze is a write freeze in force.
type Freeze struct {
	// At is when it was set, by the server's clock.
	At time.Time `db:"frozen_at"`
	// By is the application_name of the session that set it.
	By string `db:"frozen_by"`
	// ReadAt is when it was read, by the server's clock: after it was
	// committed, so no writer that begins later passes its check.
	ReadAt time.Time `db:"read_at"`
}

// SetFreeze sets the write freeze, unless one is in force already (isNew
// false: that one is kept), and returns it.
func SetFreeze(ctx context.Context, db *sqlx.DB) (f Freeze, isNew bool, err error) {
	res, err := db.ExecContext(ctx, `INSERT INTO `+FreezeTable+` DEFAULT VALUES ON CONFLICT (id) DO NOTHING`)
	if err != nil {
		return Freeze{}, false, fmt.Errorf("set the write freeze: %w", noFreezeTable(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return Freeze{}, false, fmt.Errorf("set the write freeze: %w", err)
	}
	f, _, err = ReadFreeze(ctx, db)
	return f, n == 1, err
}

// ReadFreeze reads the write freeze in force, if any.
func ReadFreeze(ctx context.Context, db *sqlx.DB) (f Freeze, frozen bool, err error) {
	return freezeRow(ctx, db, "read", `SELECT frozen_at, frozen_by, clock_timestamp() AS read_at FROM `+FreezeTable)
}

// LiftFreeze lifts the write freeze and returns the one it lifted, if any.
func LiftFreeze(ctx context.Context, db *sqlx.DB) (f Freeze, lifted bool, err error) {
	return freezeRow(ctx, db, "lift", `DELETE FROM `+FreezeTable+` RETURNING frozen_at, frozen_by, clock_timestamp() AS read_at`)
}

// freezeRow runs query, which returns the freeze row if there is one.
func freezeRow(ctx context.Context, db *sqlx.DB, what, query string) (f Freeze, found bool, err error) {
	err = db.GetContext(ctx, &f, query)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Freeze{}, false, nil
	case err != nil:
		return Freeze{}, false, fmt.Errorf("%s the write freeze: %w", what, noFreezeTable(err))
	}
	return f, true, nil
}

// WritersBefore counts the outbox writers in progress that began before at
// (a Freeze's ReadAt): a writer that passed its freeze check before the
// freeze was committed may still write, and one that began after refuses.
func WritersBefore(ctx context.Context, db *sqlx.DB, at time.Time) (int, error) {
	var n int
	err := db.GetContext(ctx, &n, `SELECT count(*) FROM promotion.outbox_writers WHERE granted AND xact_start <= $1`, at)
	if err != nil {
		return 0, fmt.Errorf("count outbox writers: %w", err)
	}
	return n, nil
}

// noFreezeTable turns undefined_table into ErrNoFreezeTable.
func noFreezeTable(err error) error {
	var pqErr *pq.Error
	if errors.As(err, &pqErr) && pqErr.Code == "42P01" {
		return fmt.Errorf("%w: %w", ErrNoFreezeTable, err)
	}
	return err
}
