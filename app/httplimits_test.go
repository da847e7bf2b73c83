package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/app/api"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// startPromotionForLimits starts a promotion process (the test binary, or
// bin when given) with env added to its settings and waits until it is
// ready; it returns the process and its address.
func startPromotionForLimits(t *testing.T, bin string, env ...string) (*command, string) {
	t.Helper()
	addr := freeAddr(t)
	settings := envOf(append([]string{"DATABASE_URL=" + pgtest.DatabaseURL(t), "KAFKA_BROKERS=" + strings.Join(kafkatest.Brokers(t), ","),
		"HTTP_ADDR=" + addr, "PROMOTION_TOPIC=pf-limits-" + kafkatest.RandomSuffix(), "MIGRATE_ON_START=true", "LOG_LEVEL=warn",
		"PROMOTION_API_TOKENS=token-a-0123456789=0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b,token-b-0123456789=1c9f2a4d-3e5b-4f6a-9b7c-8d9e0f1a2b3c"}, env...)...)
	var c *command
	if bin == "" {
		c = startCommand(t, settings, "promotion")
	} else {
		c = startProgram(t, bin, settings, "promotion")
	}
	c.waitReady(t, addr)
	return c, addr
}

// rss is the resident set size of process pid, in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	require.FailNow(t, "no VmRSS in /proc/<pid>/status")
	return 0
}

// sendHugeHeader opens a connection and sends a request line and one header
// of size bytes without the CRLF that would end the header block, as an
// attacker holding the server's buffers would, until the server closes the
// connection or ctx ends.
func sendHugeHeader(ctx context.Context, addr string, size int) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return
	}
	defer conn.Close()
	go func() { <-ctx.Done(); conn.Close() }()
	if _, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: promoflow\r\nX-Filler: ")); err != nil {
		return
	}
	chunk := []byte(strings.Repeat("a", 16<<10))
	for sent := 0; sent < size; sent += len(chunk) {
		if _, err := conn.Write(chunk); err != nil {
			return
		}
	}
	_, _ = conn.Read(make([]byte, 1)) // hold it until the server answers or closes
}

// TestHTTP_LargeHeadersCannotExhaustMemory: 150 connections, each sending a
// 1 MB header without its final CRLF, again and again for a few seconds,
// leave the promotion process's memory near where it was, and /healthz keeps
// answering. With Go's default header limit (1 MiB) the same took a process
// from 28 MB to 419 MB.
func TestHTTP_LargeHeadersCannotExhaustMemory(t *testing.T) {
	t.Parallel()
	// A binary built without the race detector, which would multiply the
	// process's memory (by +85 to +205 MB under this attack).
	c, addr := startPromotionForLimits(t, buildStamped(t))
	pid := c.cmd.Process.Pid
	before := rss(t, pid)

	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 150 {
		wg.Go(func() {
			for ctx.Err() == nil {
				sendHugeHeader(ctx, addr, 1<<20)
			}
		})
	}
	var peak atomic.Int64
	wg.Go(func() {
		for ctx.Err() == nil {
			peak.Store(max(peak.Load(), rss(t, pid)))
			time.Sleep(20 * time.Millisecond)
		}
	})
	var latencies []time.Duration
	client := &http.Client{Timeout: 10 * time.Second}
	for ctx.Err() == nil {
		start := time.Now()
		resp, err := client.Get("http://" + addr + "/healthz")
		require.NoError(t, err, "/healthz under the attack")
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		latencies = append(latencies, time.Since(start))
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	slices.Sort(latencies)
	p99 := latencies[len(latencies)*99/100]
	grew := peak.Load() - before
	t.Logf("RSS before %d MB, peak %d MB (+%d MB); /healthz p99 %s over %d probes",
		before>>20, peak.Load()>>20, grew>>20, p99.Round(time.Millisecond), len(latencies))
	// The attack's own 150 senders share the machine's cores with the
	// process, so /healthz is bounded loosely, and more so when they run
	// under the race detector.
	bound, slow := int64(64<<20), 2*time.Second // seen: +23 MB, p99 250ms; with 1 MiB headers +487 MB
	if raceBuild {
		slow = 10 * time.Second // seen: p99 0.6-2.4s
	}
	require.Less(t, grew, bound, "150 connections of 1 MB headers grew the process by %d MB: the header limit does not hold", grew>>20)
	require.Less(t, p99, slow, "/healthz p99 under the attack")
}

// TestHTTP_RateLimitAnswers429: a tenant that calls faster than
// API_RATE_LIMIT allows gets 429 with Retry-After and a problem document,
// while another tenant's calls and an anonymous caller's 401 are unaffected;
// the catalog's admin token is limited the same way (ADMIN_RATE_LIMIT).
func TestHTTP_RateLimitAnswers429(t *testing.T) {
	t.Parallel()
	_, addr := startPromotionForLimits(t, "", "API_RATE_LIMIT=1", "API_RATE_BURST=5")
	get := func(token string) *http.Response {
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/promotions", nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	var codes []int
	var limited *http.Response
	for range 20 {
		resp := get("token-a-0123456789")
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode == http.StatusTooManyRequests && limited == nil {
			limited = resp
		}
	}
	require.NotNil(t, limited, "20 calls at once past a burst of 5 were all served: %v", codes)
	require.Equal(t, slices.Repeat([]int{http.StatusOK}, 5), codes[:5], "the burst is served first: %v", codes)
	secs, err := strconv.Atoi(limited.Header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After in whole seconds")
	require.GreaterOrEqual(t, secs, 1)
	require.Equal(t, "application/problem+json", limited.Header.Get("Content-Type"))
	var problem struct{ Code string }
	require.NoError(t, json.NewDecoder(limited.Body).Decode(&problem))
	require.Equal(t, "rate_limited", problem.Code)

	require.Equal(t, http.StatusOK, get("token-b-0123456789").StatusCode, "another tenant has a bucket of its own")
	require.Equal(t, http.StatusUnauthorized, get("").StatusCode, "an anonymous caller is refused before any bucket")
	require.Eventually(t, func() bool { return get("token-a-0123456789").StatusCode == http.StatusOK }, 5*time.Second, 100*time.Millisecond,
		"the tenant is served again once its bucket refills")

	mux := http.NewServeMux()
	(&api.Catalog{DB: pgtest.DB(t), FeedToken: "admin", RateLimit: api.RateLimit{PerSecond: 1, Burst: 3},
		Log: slog.New(slog.DiscardHandler)}).Register(mux, http.NewServeMux())
	srv := httptest.NewServer(api.JSONErrors(mux))
	t.Cleanup(srv.Close)
	codes = nil
	for range 6 {
		req, err := http.NewRequest(http.MethodPut, srv.URL+"/cards/projects/"+uuid.NewString(), strings.NewReader("{}"))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer admin")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	require.Contains(t, codes[3:], http.StatusTooManyRequests, "the admin token past its burst of 3: %v", codes)
	require.NotContains(t, codes[:3], http.StatusTooManyRequests, "the admin token's burst of 3: %v", codes)
}

// TestHTTP_InFlightCapAnswers503: with HTTP_MAX_IN_FLIGHT requests under
// way, one more is answered 503 overloaded with Retry-After at once, while
// /healthz still answers; once a slot frees, requests are served again.
func TestHTTP_InFlightCapAnswers503(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, _ *http.Request) {
		entered <- struct{}{}
		<-release
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {})
	srv := httptest.NewServer(httpLimits{MaxConnections: 8, MaxInFlight: 1}.handler(mux))
	t.Cleanup(srv.Close)
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // before srv.Close, which waits for the held handler

	done := make(chan int, 1)
	go func() {
		resp, err := http.Get(srv.URL + "/slow")
		if err == nil {
			resp.Body.Close()
			done <- resp.StatusCode
		}
		close(done)
	}()
	<-entered
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(srv.URL + "/slow")
	require.NoError(t, err, "a request past the cap must be answered at once, not held")
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "a request past the cap")
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	health, err := http.Get(srv.URL + "/healthz")
	require.NoError(t, err)
	health.Body.Close()
	require.Equal(t, http.StatusOK, health.StatusCode, "/healthz is not counted")
	free()
	require.Equal(t, http.StatusOK, <-done)
	go func() { <-entered }()
	again, err := http.Get(srv.URL + "/slow")
	require.NoError(t, err)
	again.Body.Close()
	require.Equal(t, http.StatusOK, again.StatusCode, "served once the slot is free")
}
