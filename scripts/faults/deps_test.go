//go:build faults

package faults

import (
	"net/http"
	"testing"
	"time"
)

// waitUnready waits until each of procs answers /readyz with 503; a violation
// names those that did not within timeout.
func (e *env) waitUnready(procs []*proc, timeout time.Duration) {
	unready := map[string]bool{}
	eventually(e.ctx, timeout, func() bool {
		for _, p := range procs {
			if !unready[p.name] && p.ready() == http.StatusServiceUnavailable {
				unready[p.name] = true
			}
		}
		return len(unready) == len(procs)
	})
	for _, p := range procs {
		if !unready[p.name] {
			e.violate("%s did not answer /readyz unready within %s", p.name, timeout)
		}
	}
}

// waitCreated waits until traffic has created n more purchases; a violation
// when it did not within timeout.
func (tr *traffic) waitCreated(n int64, timeout time.Duration, while string) {
	from := tr.created.Load()
	if _, ok := eventually(tr.e.ctx, timeout, func() bool { return tr.created.Load() >= from+n }); !ok {
		tr.e.violate("%d purchases created in %s %s, want %d", tr.created.Load()-from, timeout, while, n)
	}
}

// restartKafka: under traffic Kafka (every broker and controller) stops,
// and starts again once every catalog process answers /readyz unready.
// While it is down the API keeps creating purchases (50 more get 201; their
// events wait in the outbox, which holds rows) and answers no request with
// a 503 or a dropped connection. Every process is
// ready again by itself within 2 minutes, 50 more purchases are created,
// and the relay and the consumer catch up (the checker at quiescence).
func restartKafka(t *testing.T, e *env) int {
	tr := e.drive(100, 0.2)
	tr.waitCreated(100, 30*time.Second, "before the fault")
	e.s.stack(t, "down", "kafka")
	e.fault()
	unavailable, dropped := tr.unavailable.Load(), tr.dropped.Load()
	e.waitUnready(e.catalogs, time.Minute)
	tr.waitCreated(50, 30*time.Second, "while Kafka was down")
	var waiting int
	if err := e.db.Get(&waiting, `SELECT count(*) FROM promotion.outbox_messages`); err != nil || waiting == 0 {
		e.violate("while Kafka was down no event waited in the outbox (%d rows, %v)", waiting, err)
	}
	if u, d := tr.unavailable.Load()-unavailable, tr.dropped.Load()-dropped; u != 0 || d != 0 {
		e.violate("while Kafka was down the API answered %d requests with 503 and dropped %d", u, d)
	}
	e.s.stack(t, "up", "kafka")
	if !e.waitReady(2 * time.Minute) {
		e.violate("the processes did not become ready by themselves after Kafka came back")
	}
	tr.waitCreated(50, 30*time.Second, "after Kafka came back")
	tr.halt()
	t.Logf("traffic: %s", tr)
	return int(tr.created.Load())*2 + int(tr.cancels.Load())
}

// restartPostgres: under traffic PostgreSQL stops (pg_ctl stop -m fast,
// which cuts every connection) and starts again once every process answers
// /readyz unready. Meanwhile the API answers 503 with Retry-After and a JSON
// error (at least one such answer), never another 5xx or a dropped
// connection (traffic's checks). Every process is ready again by itself
// within 2 minutes, and 50 more purchases are created.
func restartPostgres(t *testing.T, e *env) int { return postgresOutage(t, e, "down") }

// crashPostgres is restartPostgres with a crash: an immediate shutdown (no
// checkpoint, every backend ended at once, whatever transactions were under
// way lost), then crash recovery at the start. Every effect committed before
// the crash is kept and none is doubled (the suite's checks after it).
func crashPostgres(t *testing.T, e *env) int {
	var durable string
	if err := e.db.Get(&durable, `SHOW synchronous_commit`); err != nil || durable == "off" {
		t.Fatalf("the fault stack's PostgreSQL runs with synchronous_commit %q (%v): a crash loses the commits of its last moments by design; run it with PROMOFLOW_PG_SYNCHRONOUS_COMMIT=on (scripts/faults.sh does)", durable, err)
	}
	return postgresOutage(t, e, "kill")
}

// postgresOutage stops PostgreSQL under traffic with stack.sh's verb and
// starts it again, as restartPostgres says.
func postgresOutage(t *testing.T, e *env, verb string) int {
	tr := e.drive(100, 0.2)
	tr.waitCreated(100, 30*time.Second, "before the fault")
	unavailable := tr.unavailable.Load()
	e.s.stack(t, verb, "postgres")
	e.fault()
	e.waitUnready(e.all(), time.Minute)
	if _, ok := eventually(e.ctx, 30*time.Second, func() bool { return tr.unavailable.Load() > unavailable }); !ok {
		e.violate("no request got a 503 while PostgreSQL was down")
	}
	e.s.stack(t, "up", "postgres")
	if !e.waitReady(2 * time.Minute) {
		e.violate("the processes did not become ready by themselves after PostgreSQL came back")
	}
	tr.waitCreated(50, 30*time.Second, "after PostgreSQL came back")
	tr.halt()
	t.Logf("traffic: %s", tr)
	return int(tr.created.Load())*2 + int(tr.cancels.Load())
}
