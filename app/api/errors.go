// Package api is the HTTP face of both contexts: the purchase API, the card
// feed and reads, and the projection rebuild.
package api

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"

	"github.com/lib/pq"
)

// ProblemContentType is the media type of every 4xx/5xx answer (RFC 9457).
const ProblemContentType = "application/problem+json"

// Problem is the RFC 9457 problem details body of every 4xx/5xx answer. Type
// is "about:blank", so Title is the status's phrase; Code, an extension
// member, says which problem it is, for a client to act on.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Code is the machine-readable problem, such as validation_failed.
	Code string `json:"code"`
	// Fields names each invalid input field of a validation_failed answer.
	Fields []FieldError `json:"fields,omitempty"`
}

// FieldError names one invalid input field.
type FieldError struct {
	Field   string `json:"field"`
	Problem string `json:"problem"`
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// writeError answers status with a problem details body.
func writeError(w http.ResponseWriter, status int, code, detail string, fields ...FieldError) {
	w.Header().Set("Content-Type", ProblemContentType)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Problem{Type: "about:blank", Title: http.StatusText(status), Status: status,
		Detail: detail, Code: code, Fields: fields})
}

// retryAfter is how many seconds a 503 asks the caller to wait.
const retryAfter = "2"

// writeUnavailable answers 503 with Retry-After: the request changed nothing
// that the caller cannot safely retry.
func writeUnavailable(w http.ResponseWriter) {
	w.Header().Set("Retry-After", retryAfter)
	writeError(w, http.StatusServiceUnavailable, "unavailable", "the database is unavailable; retry after "+retryAfter+"s")
}

// unavailable reports an error that says PostgreSQL cannot serve right now (a
// restart, a refused or broken connection, too many connections, a timeout),
// as opposed to a bug: the caller should retry, not read a 500.
func unavailable(err error) bool {
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
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		switch pqErr.Code.Class() {
		case "08", "53", "57": // connection exception, insufficient resources, operator intervention
			return true
		}
	}
	return false
}
