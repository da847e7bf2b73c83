// Package dberr classifies PostgreSQL failures by what a caller should do
// about them: a database that takes no writes now (a hot standby, a
// read-only setting, a write freeze) answers "later", as does one that cannot
// serve at all; anything else is a fault.
//
// Every classification is by SQLSTATE or Go error type, never by message.
package dberr

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/lib/pq"
)

// ErrReadOnly marks a write the database refused because it takes no writes
// now: a standby (not yet promoted), default_transaction_read_only, or the
// promotion context's write freeze (promoflow outbox drain). Retrying later
// is right; nothing was written.
var ErrReadOnly = errors.New("the database takes no writes now")

// SQLSTATEs that say a write was refused.
const (
	// codeReadOnlyTransaction is read_only_sql_transaction: a write in a
	// read-only transaction, and the write freeze's own refusal.
	codeReadOnlyTransaction = "25006"
	// codeFeatureNotSupported is what a standby answers to BEGIN READ WRITE,
	// which lib/pq sends for every transaction: "cannot set transaction
	// read-write mode during recovery". It means read-only only while the
	// server is in recovery; elsewhere it is a fault.
	codeFeatureNotSupported = "0A000"
)

// Recovery asks a server whether it is in recovery (a standby).
type Recovery func(ctx context.Context) (bool, error)

// InRecovery is the Recovery of db's server: pg_is_in_recovery().
func InRecovery(db *sql.DB) Recovery {
	return func(ctx context.Context) (bool, error) {
		var standby bool
		err := db.QueryRowContext(ctx, `SELECT pg_is_in_recovery()`).Scan(&standby)
		return standby, err
	}
}

// Classify wraps err with ErrReadOnly when it says the database refused a
// write: SQLSTATE 25006, or 0A000 from a server that inRecovery says is a
// standby. Any other err is returned as it is.
func Classify(ctx context.Context, err error, inRecovery Recovery) error {
	if err == nil || errors.Is(err, ErrReadOnly) {
		return err
	}
	switch code(err) {
	case codeReadOnlyTransaction:
		return fmt.Errorf("%w: %w", ErrReadOnly, err)
	case codeFeatureNotSupported:
		if inRecovery == nil {
			return err
		}
		if standby, rerr := inRecovery(context.WithoutCancel(ctx)); rerr == nil && standby {
			return fmt.Errorf("%w (a standby): %w", ErrReadOnly, err)
		}
	}
	return err
}

// ReadOnly reports whether err is a refused write (Classify), counting a
// bare 25006 too.
func ReadOnly(err error) bool {
	return errors.Is(err, ErrReadOnly) || code(err) == codeReadOnlyTransaction
}

// Unavailable reports an error that says PostgreSQL cannot serve right now (a
// restart, a refused or broken connection, too many connections, a timeout),
// as opposed to a bug: the caller should retry.
func Unavailable(err error) bool {
	for _, target := range []error{driver.ErrBadConn, io.EOF, io.ErrUnexpectedEOF, context.DeadlineExceeded,
		syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE} {
		if errors.Is(err, target) {
			return true
		}
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	if c := code(err); c != "" {
		switch c.Class() {
		case "08", "53", "57": // connection exception, insufficient resources, operator intervention
			return true
		}
	}
	return false
}

// Reasons of Reason, the values of the relay's errors metric label.
const (
	ReasonReadOnly    = "read_only"
	ReasonUnavailable = "unavailable"
	ReasonOther       = "other"
)

// Reason names err's class: ReasonReadOnly, ReasonUnavailable or ReasonOther.
func Reason(err error) string {
	switch {
	case ReadOnly(err):
		return ReasonReadOnly
	case Unavailable(err):
		return ReasonUnavailable
	}
	return ReasonOther
}

func code(err error) pq.ErrorCode {
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		return pqErr.Code
	}
	return ""
}
