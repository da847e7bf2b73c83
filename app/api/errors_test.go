package api

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"

	"github.com/lib/pq"
	"github.com/stretchr/testify/require"
)

func TestUnavailable_DatabaseOutagesAre503AndBugsAreNot(t *testing.T) {
	for _, err := range []error{
		&pq.Error{Code: "57P01", Message: "terminating connection due to administrator command"},
		&pq.Error{Code: "57P03", Message: "the database system is starting up"},
		&pq.Error{Code: "53300", Message: "too many connections"},
		&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED},
		driver.ErrBadConn,
	} {
		require.True(t, unavailable(fmt.Errorf("begin: %w", err)), "%v", err)
	}
	for _, err := range []error{
		&pq.Error{Code: "23505", Message: "duplicate key"},
		errors.New("a bug"),
	} {
		require.False(t, unavailable(fmt.Errorf("insert: %w", err)), "%v", err)
	}

	rec := httptest.NewRecorder()
	writeUnavailable(rec)
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, retryAfter, rec.Header().Get("Retry-After"))
	require.Equal(t, ProblemContentType, rec.Header().Get("Content-Type"))
	require.JSONEq(t, `{"type":"about:blank","title":"Service Unavailable","status":503,"code":"unavailable",
		"detail":"the database is unavailable; retry after 2s"}`, rec.Body.String())
}

func TestJSONErrors_UnknownRoutesAndMethodsAreProblems(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /promotions/{id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h := JSONErrors(mux)

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/nowhere", nil))
	require.Equal(t, http.StatusNotFound, rec.Code)
	require.JSONEq(t, `{"type":"about:blank","title":"Not Found","status":404,"code":"not_found",
		"detail":"no such route: GET /nowhere"}`, rec.Body.String())

	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodDelete, "/promotions/x", nil))
	require.Equal(t, http.StatusMethodNotAllowed, rec.Code)
	require.Contains(t, rec.Header().Get("Allow"), "GET")
	require.Equal(t, ProblemContentType, rec.Header().Get("Content-Type"))

	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/promotions/x", nil))
	require.Equal(t, http.StatusTeapot, rec.Code, "a known route answers itself")
}
