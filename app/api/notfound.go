package api

import (
	"net/http"
)

// JSONErrors answers what mux answers by itself (404 for a path it does not
// know, 405 for a known path with another method) as a problem details body
// like every other error of the API, keeping the Allow header.
func JSONErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		rec := &statusRecorder{header: http.Header{}}
		h.ServeHTTP(rec, r)
		if allow := rec.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		switch rec.status {
		case http.StatusMethodNotAllowed:
			writeError(w, rec.status, "method_not_allowed", r.Method+" is not allowed here; allowed: "+rec.header.Get("Allow"))
		case http.StatusNotFound, 0:
			writeError(w, http.StatusNotFound, "not_found", "no such route: "+r.Method+" "+r.URL.Path)
		default:
			writeError(w, rec.status, "bad_request", http.StatusText(rec.status))
		}
	})
}

// statusRecorder keeps the status and headers a handler writes and drops its body.
type statusRecorder struct {
	header http.Header
	status int
}

func (s *statusRecorder) Header() http.Header { return s.header }

func (s *statusRecorder) WriteHeader(status int) {
	if s.status == 0 {
		s.status = status
	}
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	s.WriteHeader(http.StatusOK)
	return len(b), nil
}
