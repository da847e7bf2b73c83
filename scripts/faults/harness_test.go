//go:build faults

// Package faults is the fault-injection suite. It runs the built promoflow
// binaries against a real PostgreSQL and Kafka (scripts/faults.sh starts a
// stack of their own, so restarts never disturb other tests), drives traffic,
// injects one fault per scenario, waits for quiescence and checks the
// system's invariants from outside, while a real Prometheus scrapes the
// processes and evaluates the project's alert rules. The checks of the topic
// and the cards are the checker of checker_test.go (no build tag), which
// TestChecker_DetectsEachViolation shows can fail.
package faults

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/promoflow/promoflow/router/kafkakit"
)

var (
	form = flag.String("faults.form", "short", "short (CI, a few minutes) or full (the sizes in the scenarios' names)")
	only = flag.String("faults.only", "", "run only the scenarios whose number or name contains this (or one of these, comma-separated)")
)

// size picks a scenario size by form.
func size(short, full int) int {
	if *form == "full" {
		return full
	}
	return short
}

// suite is what every scenario shares.
type suite struct {
	root    string // repository root
	bin     string // the promoflow binary under test
	work    string // logs, Prometheus data
	dbBase  string // DATABASE_URL of the stack's postgres database
	brokers string // KAFKA_BROKERS, comma-separated
	// routes are the brokers' proxied listeners (KAFKA_PROXY_ROUTES): a
	// proxy listening at each listen address, forwarding to its upstream,
	// carries a process's whole Kafka traffic.
	routes []route
	prom   *prometheus
	// previousOnce builds the previous release (upgrade_test.go) once, for
	// the scenarios that run it.
	previousOnce  sync.Once
	previousBuilt builtRelease
	previousErr   error
}

// route is where a proxy listens and where it forwards to.
type route struct{ listen, upstream string }

func newSuite(t *testing.T) *suite {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	s := &suite{root: root, work: t.TempDir(), dbBase: os.Getenv("DATABASE_URL"), brokers: os.Getenv("KAFKA_BROKERS")}
	if s.dbBase == "" || s.brokers == "" {
		t.Fatal("DATABASE_URL and KAFKA_BROKERS must name the fault stack: run scripts/faults.sh")
	}
	for _, r := range strings.Split(os.Getenv("KAFKA_PROXY_ROUTES"), ",") {
		if listen, upstream, ok := strings.Cut(r, "="); ok {
			s.routes = append(s.routes, route{listen, upstream})
		}
	}
	if dir := os.Getenv("FAULTS_LOG_DIR"); dir != "" {
		s.work = dir
		_ = os.MkdirAll(dir, 0o755)
	}
	s.bin = filepath.Join(s.work, "promoflow")
	build := exec.Command("go", "build", "-o", s.bin, "./app")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build promoflow: %v\n%s", err, out)
	}
	s.prom = startPrometheus(t, s)
	return s
}

// cluster is the fault stack's Kafka, as the suite's own clients reach it.
func (s *suite) cluster() kafkakit.Cluster {
	return kafkakit.Cluster{Brokers: strings.Split(s.brokers, ",")}
}

// stack runs scripts/stack.sh of the fault stack (its environment is inherited).
func (s *suite) stack(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{filepath.Join(s.root, "scripts/stack.sh")}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("stack.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// freeAddr is a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// eventually polls cond every 100ms until it holds or timeout passes, and
// returns how long it took.
func eventually(ctx context.Context, timeout time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if cond() {
			return time.Since(start), true
		}
		select {
		case <-ctx.Done():
			return time.Since(start), cond()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// result is one scenario's line in the summary.
type result struct {
	num        int
	name       string
	events     int
	faults     int
	recovery   time.Duration
	violations []string
	took       time.Duration
	// detail is what the scenario measured besides, e.g. the relay's stall.
	detail string
}

func (r result) line() string {
	verdict := "PASS"
	if len(r.violations) > 0 {
		verdict = "FAIL"
	}
	line := fmt.Sprintf("scenario %2d %-40s %s: events %d, faults %d, recovered in %s, violations %d, took %s",
		r.num, r.name, verdict, r.events, r.faults, r.recovery.Round(100*time.Millisecond), len(r.violations),
		r.took.Round(time.Second))
	if r.detail != "" {
		line += "; " + r.detail
	}
	if len(r.violations) > 0 {
		// The first one, so that a summary alone says what broke.
		first := r.violations[0]
		if len(first) > 300 {
			first = first[:300] + "…"
		}
		line += "; first violation: " + first
	}
	return line
}
