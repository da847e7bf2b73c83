// Package api is the HTTP face of both contexts: the purchase API, the card
// feed and reads, and the projection rebuild.
package api

import (
	"encoding/json"
	"net/http"

	"github.com/promoflow/promoflow/handlers/dberr"
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

// unavailable reports an error that says PostgreSQL cannot serve right now.
var unavailable = dberr.Unavailable

// writeReadOnly answers 503 with Retry-After to a write that the database
// refused because it takes no writes now (a standby, a read-only setting, a
// write freeze): nothing was written, and the same request may be retried.
func writeReadOnly(w http.ResponseWriter) {
	w.Header().Set("Retry-After", retryAfter)
	writeError(w, http.StatusServiceUnavailable, "read_only",
		"the database takes no writes now (a failover, or a write freeze for maintenance); nothing was written; retry after "+retryAfter+"s")
}

// WriteOverloaded answers 503 with Retry-After to a request the process has
// no room for now (HTTP_MAX_IN_FLIGHT requests under way).
func WriteOverloaded(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, "overloaded", "too many requests under way; retry after 1s")
}
