package middleware_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/dberr"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
)

// TestClassify_EveryFailureHasOneClass pins the table of the package
// documentation: each SQLSTATE or error it names, wrapped as the handler
// returns it, has the class (and, for the record's faults, the DLQ code)
// that the table says.
func TestClassify_EveryFailureHasOneClass(t *testing.T) {
	t.Parallel()
	sql := func(code pq.ErrorCode) error {
		return fmt.Errorf("group commit: apply contributions: %w", &pq.Error{Code: code, Message: "m"})
	}
	for _, tc := range []struct {
		name  string
		err   error
		class middleware.Class
		code  string
	}{
		{"contract violation", &event.ContractError{Field: "Version", Reason: "must be >= 1"}, middleware.ClassRecord, middleware.CodeContractViolation},
		{"key is not the PurchaseId", &event.KeyError{Key: []byte("k")}, middleware.ClassRecord, middleware.CodeKeyMismatch},
		{"22P02 invalid bytes", sql("22P02"), middleware.ClassRecord, middleware.CodeSQLRejected},
		{"23505 unique violation", sql("23505"), middleware.ClassRecord, middleware.CodeSQLRejected},
		{"42804 datatype mismatch", sql("42804"), middleware.ClassRecord, middleware.CodeSQLRejected},
		{"54000 index row too large", sql("54000"), middleware.ClassRecord, middleware.CodeSQLRejected},
		{"54001 statement too complex", sql("54001"), middleware.ClassRecord, middleware.CodeSQLRejected},

		{"40001 serialization failure", sql("40001"), middleware.ClassTransient, ""},
		{"40P01 deadlock", sql("40P01"), middleware.ClassTransient, ""},
		{"55P03 lock timeout", sql("55P03"), middleware.ClassTransient, ""},
		{"57014 statement timeout", sql("57014"), middleware.ClassTransient, ""},
		{"53200 out of memory or lock table", sql("53200"), middleware.ClassTransient, ""},
		{"the unit of work's timeout", fmt.Errorf("group commit: %w", context.DeadlineExceeded), middleware.ClassTransient, ""},

		{"08006 connection failure", sql("08006"), middleware.ClassSystemic, ""},
		{"53100 disk full", sql("53100"), middleware.ClassSystemic, ""},
		{"53300 too many connections", sql("53300"), middleware.ClassSystemic, ""},
		{"57P01 admin shutdown", sql("57P01"), middleware.ClassSystemic, ""},
		{"57P03 cannot connect now", sql("57P03"), middleware.ClassSystemic, ""},
		{"42501 missing privilege", sql("42501"), middleware.ClassSystemic, ""},
		{"42P01 missing table", sql("42P01"), middleware.ClassSystemic, ""},
		{"42703 missing column", sql("42703"), middleware.ClassSystemic, ""},
		{"42883 missing function", sql("42883"), middleware.ClassSystemic, ""},
		{"25006 read-only server", sql("25006"), middleware.ClassSystemic, ""},
		{"a write the database refused", fmt.Errorf("apply: %w", dberr.ErrReadOnly), middleware.ClassSystemic, ""},
		{"connection refused", fmt.Errorf("dial: %w", syscall.ECONNREFUSED), middleware.ClassSystemic, ""},
		{"broken connection", fmt.Errorf("exec: %w", driver.ErrBadConn), middleware.ClassSystemic, ""},
		{"network error", &net.OpError{Op: "read", Err: errors.New("reset")}, middleware.ClassSystemic, ""},

		{"XX000 internal error", sql("XX000"), middleware.ClassUnnamed, ""},
		{"a Go error nobody named", errors.New("something else"), middleware.ClassUnnamed, ""},
	} {
		f := middleware.Classify(tc.err)
		require.Equal(t, tc.class, f.Class, "%s: class %s, want %s", tc.name, f.Class, tc.class)
		require.Equal(t, tc.code, f.Code, tc.name)
		if tc.class == middleware.ClassRecord {
			require.NotEmpty(t, f.Reason, tc.name)
		}
	}
}
