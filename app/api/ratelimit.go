package api

import (
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimit is how fast one credential (a tenant's tokens, the admin token)
// may call: PerSecond on average, Burst at once. PerSecond 0 turns it off.
// Each process keeps its own buckets, so N copies behind a load balancer let
// a credential through up to N times as fast.
type RateLimit struct {
	PerSecond float64
	Burst     int
}

// Rate limits' defaults: well above what a tenant's managers or the card feed
// send, well below what a flood of one credential would.
const (
	RateLimitPerSecondDefault = 1000
	RateLimitBurstDefault     = 2000
)

// limiters holds one token bucket per credential. Its keys come only from
// authenticated requests (a configured tenant, the admin token), so an
// anonymous caller cannot grow it.
type limiters struct {
	limit RateLimit
	mu    sync.Mutex
	by    map[string]*rate.Limiter
}

func newLimiters(l RateLimit) *limiters { return &limiters{limit: l, by: map[string]*rate.Limiter{}} }

// take takes a token of key's bucket and returns a function that gives it
// back, or says how long until one is there.
func (l *limiters) take(key string) (bool, time.Duration, func()) {
	if l == nil || l.limit.PerSecond <= 0 {
		return true, 0, func() {}
	}
	l.mu.Lock()
	lim, ok := l.by[key]
	if !ok {
		lim = rate.NewLimiter(rate.Limit(l.limit.PerSecond), max(l.limit.Burst, 1))
		l.by[key] = lim
	}
	l.mu.Unlock()
	r := lim.Reserve()
	if d := r.Delay(); d > 0 {
		r.Cancel()
		return false, d, nil
	}
	return true, 0, r.Cancel
}

// metered serves next with a token of key's bucket, or answers 429 when
// none is left. A request the process answers 503 (its database is
// unavailable or read-only, it is overloaded) served nothing: its token is
// given back, so that a client retrying through an outage is not also
// refused for its rate once the outage ends.
func (l *limiters) metered(key string, w http.ResponseWriter, r *http.Request, next http.HandlerFunc) {
	ok, wait, refund := l.take(key)
	if !ok {
		writeTooMany(w, wait)
		return
	}
	sw := &statusSeen{ResponseWriter: w}
	next(sw, r)
	if sw.status == http.StatusServiceUnavailable {
		refund()
	}
}

// statusSeen notes the status a handler answers with.
type statusSeen struct {
	http.ResponseWriter
	status int
}

func (s *statusSeen) WriteHeader(status int) {
	if s.status == 0 {
		s.status = status
	}
	s.ResponseWriter.WriteHeader(status)
}

func (s *statusSeen) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// writeTooMany answers 429 with Retry-After, whole seconds rounded up.
func writeTooMany(w http.ResponseWriter, wait time.Duration) {
	secs := strconv.Itoa(max(1, int(math.Ceil(wait.Seconds()))))
	w.Header().Set("Retry-After", secs)
	writeError(w, http.StatusTooManyRequests, "rate_limited", "too many requests for this credential; retry after "+secs+"s")
}
