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
	RateLimitPerSecondDefault = 200
	RateLimitBurstDefault     = 400
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

// allow takes a token of key's bucket, or says how long until one is there.
func (l *limiters) allow(key string) (bool, time.Duration) {
	if l == nil || l.limit.PerSecond <= 0 {
		return true, 0
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
		return false, d
	}
	return true, 0
}

// writeTooMany answers 429 with Retry-After, whole seconds rounded up.
func writeTooMany(w http.ResponseWriter, wait time.Duration) {
	secs := strconv.Itoa(max(1, int(math.Ceil(wait.Seconds()))))
	w.Header().Set("Retry-After", secs)
	writeError(w, http.StatusTooManyRequests, "rate_limited", "too many requests for this credential; retry after "+secs+"s")
}
