package middleware

import (
	"context"
	"errors"
	"fmt"

	"github.com/lib/pq"

	"github.com/promoflow/promoflow/handlers/dberr"
	"github.com/promoflow/promoflow/handlers/event"
)

// Class is what a failure says about the record that met it, and so what
// Retry does with the record (the table in the package documentation).
type Class int

const (
	// ClassUnnamed is an error the table does not name: it retries with
	// backoff, and is dead-lettered (CodeStuckRecord) only once it has kept
	// failing for one record, past RetryConfig's bound, while other records
	// of the process succeed.
	ClassUnnamed Class = iota
	// ClassRecord is the record's own fault (a contract violation, bytes or a
	// statement PostgreSQL rejects, a program limit): dead-lettered at once.
	ClassRecord
	// ClassTransient is contention or a resource that frees itself (a
	// deadlock, a lock timeout, a full lock table): retried with backoff, the
	// partition paused, never dead-lettered.
	ClassTransient
	// ClassSystemic is the database or the configuration, the same for every
	// record (a lost connection, a full disk, a missing grant or table):
	// retried with backoff, the partition paused, never dead-lettered; the lag
	// alert pages an operator.
	ClassSystemic
)

// String names the class as logs spell it.
func (c Class) String() string {
	switch c {
	case ClassRecord:
		return "record"
	case ClassTransient:
		return "transient"
	case ClassSystemic:
		return "systemic"
	default:
		return "unnamed"
	}
}

// Failure is the class of an error and, for ClassRecord, the dead letter's
// error code and reason.
type Failure struct {
	// Class decides what Retry does.
	Class Class
	// Code is the x-dlq-error-code of a ClassRecord failure.
	Code string
	// Reason is the x-dlq-reason of a ClassRecord failure.
	Reason string
	// SQLState is the PostgreSQL error code the class was read from, if any.
	SQLState pq.ErrorCode
}

// sqlStates names single SQLSTATEs; it is read before sqlStateClasses, so a
// code here overrides its class.
var sqlStates = map[pq.ErrorCode]Class{
	"40001": ClassTransient, // serialization_failure
	"40P01": ClassTransient, // deadlock_detected
	"55P03": ClassTransient, // lock_not_available (lock_timeout)
	"57014": ClassTransient, // query_canceled (statement_timeout)
	"53200": ClassTransient, // out_of_memory (the shared lock table included)

	"53100": ClassSystemic, // disk_full
	"53300": ClassSystemic, // too_many_connections
	"57P01": ClassSystemic, // admin_shutdown
	"57P02": ClassSystemic, // crash_shutdown
	"57P03": ClassSystemic, // cannot_connect_now
	"57P04": ClassSystemic, // database_dropped
	"57P05": ClassSystemic, // idle_session_timeout
	"25006": ClassSystemic, // read_only_sql_transaction (a standby, a write freeze)
	// A missing grant or object is the database the process was given (a
	// role without a grant, a migration not applied yet), not the record.
	"42501": ClassSystemic, // insufficient_privilege
	"42P01": ClassSystemic, // undefined_table
	"42703": ClassSystemic, // undefined_column
	"42704": ClassSystemic, // undefined_object
	"42883": ClassSystemic, // undefined_function
}

// sqlStateClasses names SQLSTATE classes (the first two characters).
var sqlStateClasses = map[string]Class{
	"08": ClassSystemic, // connection_exception
	"28": ClassSystemic, // invalid_authorization_specification
	"3D": ClassSystemic, // invalid_catalog_name (no such database)
	"53": ClassSystemic, // insufficient_resources, unless named above
	"58": ClassSystemic, // system_error (I/O)
	"22": ClassRecord,   // data_exception
	"23": ClassRecord,   // integrity_constraint_violation
	"42": ClassRecord,   // syntax_error_or_access_rule_violation, unless named above
	"54": ClassRecord,   // program_limit_exceeded (an index row too large, ...)
}

// Classify places err in the table of the package documentation. Types
// decide, never messages: a contract or key error, then the PostgreSQL
// error in err's chain by SQLSTATE, then a Go error that says the database
// cannot serve (a refused or broken connection); anything else is unnamed.
func Classify(err error) Failure {
	var contract *event.ContractError
	if errors.As(err, &contract) {
		return Failure{Class: ClassRecord, Code: CodeContractViolation, Reason: contract.Error()}
	}
	var key *event.KeyError
	if errors.As(err, &key) {
		return Failure{Class: ClassRecord, Code: CodeKeyMismatch, Reason: key.Error()}
	}
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		f := Failure{SQLState: pqErr.Code}
		class, ok := sqlStates[pqErr.Code]
		if !ok {
			class = sqlStateClasses[string(pqErr.Code.Class())]
		}
		f.Class = class
		if class == ClassRecord {
			f.Code = CodeSQLRejected
			f.Reason = fmt.Sprintf("SQLSTATE %s (%s): %s", pqErr.Code, pqErr.Code.Name(), pqErr.Message)
		}
		return f
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		// The unit of work's own timeout: a slow transaction, as 57014 is.
		return Failure{Class: ClassTransient}
	case dberr.ReadOnly(err), dberr.Unavailable(err):
		return Failure{Class: ClassSystemic}
	}
	return Failure{Class: ClassUnnamed}
}
