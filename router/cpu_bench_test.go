package router_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// clockTicks is the unit of the CPU times in /proc/<pid>/stat (USER_HZ, 100
// on every Linux build Go supports).
const clockTicks = 100

// procCPU is the CPU time (user + system) a process used so far, from
// /proc/<pid>/stat; ok is false when there is no such process.
func procCPU(pid int) (cpu time.Duration, ok bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may hold spaces; the fields after it are plain.
	end := strings.LastIndexByte(string(raw), ')')
	fields := strings.Fields(string(raw)[end+1:])
	if len(fields) < 13 {
		return 0, false
	}
	var ticks int64
	for _, f := range fields[11:13] { // utime, stime: fields 14 and 15
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, false
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, true
}

// selfCPU is this process's CPU time so far (getrusage, in microseconds).
func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pgBackends samples the CPU time of the PostgreSQL backends that serve one
// database (pg_stat_activity's pids of it, read in /proc: the server must run
// on this machine) every 50ms, so that a backend that ends between two
// samples loses at most 50ms of its time. CPU is the sum, over every backend
// seen, of its time at its last sample.
type pgBackends struct {
	mu   sync.Mutex
	last map[int]time.Duration
	stop chan struct{}
	done chan struct{}
}

// watchPGBackends starts sampling the backends of db's database until the
// benchmark ends. It returns nil when PostgreSQL does not run on this machine.
func watchPGBackends(b *testing.B, db *sqlx.DB) *pgBackends {
	conn, err := db.Connx(context.Background())
	require.NoError(b, err)
	var self int
	require.NoError(b, conn.GetContext(context.Background(), &self, `SELECT pg_backend_pid()`))
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", self)); err != nil || !strings.HasPrefix(string(comm), "postgres") {
		b.Log("PostgreSQL does not run on this machine: its CPU time is not measured")
		conn.Close()
		return nil
	}
	w := &pgBackends{last: map[int]time.Duration{}, stop: make(chan struct{}), done: make(chan struct{})}
	w.sample(conn, self)
	go func() {
		defer close(w.done)
		defer conn.Close()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				w.sample(conn, self)
				return
			case <-tick.C:
				w.sample(conn, self)
			}
		}
	}()
	b.Cleanup(w.close)
	return w
}

// sample reads the CPU time of every backend of the database but the
// sampler's own.
func (w *pgBackends) sample(conn *sqlx.Conn, self int) {
	var pids []int
	if err := conn.SelectContext(context.Background(), &pids,
		`SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> $1`, self); err != nil {
		return // the database is being dropped at the benchmark's end
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, pid := range pids {
		if cpu, ok := procCPU(pid); ok {
			w.last[pid] = cpu
		}
	}
}

// CPU is the backends' CPU time so far (0 for a nil pgBackends).
func (w *pgBackends) CPU() time.Duration {
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var sum time.Duration
	for _, cpu := range w.last {
		sum += cpu
	}
	return sum
}

// close takes a last sample and stops sampling.
func (w *pgBackends) close() {
	if w == nil {
		return
	}
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// cpuPerEvent is what a run cost in CPU time per event, on each side.
type cpuPerEvent struct {
	events             int
	consumer, postgres time.Duration
	postgresMeasured   bool
}

func (c *cpuPerEvent) add(events int, consumer, postgres time.Duration, measured bool) {
	c.events += events
	c.consumer += consumer
	c.postgres += postgres
	c.postgresMeasured = measured
}

// report adds the consumer's, PostgreSQL's and their total µs per event.
func (c cpuPerEvent) report(b *testing.B, consumerName string) { c.reportAs(b, "", consumerName) }

// reportAs is report with every name led by prefix.
func (c cpuPerEvent) reportAs(b *testing.B, prefix, consumerName string) {
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(c.events) }
	b.ReportMetric(us(c.consumer), prefix+consumerName+"-cpu-us/event")
	if c.postgresMeasured {
		b.ReportMetric(us(c.postgres), prefix+"postgres-cpu-us/event")
		b.ReportMetric(us(c.consumer+c.postgres), prefix+"total-cpu-us/event")
	}
}
