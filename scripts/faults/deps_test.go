//go:build faults

package faults

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"
)

// watchReady polls /readyz of procs until stopped, and reports which of them
// were seen unready.
func (e *env) watchReady(procs []*proc) (stop func() map[string]bool) {
	ctx, cancel := context.WithCancel(e.ctx)
	var mu sync.Mutex
	unready := map[string]bool{}
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() {
			for ctx.Err() == nil {
				if code := p.ready(); code != http.StatusOK && code != 0 {
					mu.Lock()
					unready[p.name] = true
					mu.Unlock()
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	return func() map[string]bool { cancel(); wg.Wait(); return unready }
}

// restartKafka: the broker goes down under load and comes back. The API keeps
// answering (its writes go to the outbox), the catalog turns unready and then
// ready by itself, the relay and the consumers catch up.
func restartKafka(t *testing.T, e *env) int {
	tr := e.drive(100, 0.2)
	time.Sleep(2 * time.Second)
	watch := e.watchReady(e.catalogs)
	e.s.stack(t, "down", "kafka")
	e.fault()
	time.Sleep(5 * time.Second)
	e.s.stack(t, "up", "kafka")
	if !e.waitReady(2 * time.Minute) {
		e.violate("the processes did not become ready by themselves after Kafka came back")
	}
	for _, p := range e.catalogs {
		if !watch()[p.name] {
			e.violate("%s never turned unready while Kafka was down", p.name)
		}
	}
	time.Sleep(2 * time.Second)
	tr.halt()
	t.Logf("traffic: %s", tr)
	return int(tr.created.Load())*2 + int(tr.cancels.Load())
}

// restartPostgres: pg_ctl restart -m fast under load. The API answers 503 with
// Retry-After and a JSON error, never a bare 500; every process turns unready,
// then ready by itself.
func restartPostgres(t *testing.T, e *env) int {
	tr := e.drive(100, 0.2)
	time.Sleep(2 * time.Second)
	watch := e.watchReady(e.all())
	e.s.stack(t, "restart", "postgres")
	e.fault()
	time.Sleep(2 * time.Second)
	if !e.waitReady(2 * time.Minute) {
		e.violate("the processes did not become ready by themselves after PostgreSQL came back")
	}
	unready := watch()
	for _, p := range e.all() {
		if !unready[p.name] {
			t.Logf("%s was not seen unready during the restart (it may have been quicker than a probe)", p.name)
		}
	}
	if len(unready) == 0 {
		e.violate("no process turned unready while PostgreSQL restarted")
	}
	time.Sleep(2 * time.Second)
	tr.halt()
	t.Logf("traffic: %s", tr)
	return int(tr.created.Load())*2 + int(tr.cancels.Load())
}
