//go:build faults

package faults

import (
	"fmt"
	"testing"
	"time"

	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// replication is how a scenario's standby follows its primary.
type replication string

const (
	// synchronous: a commit returns once the standby has flushed it
	// (synchronous_standby_names, synchronous_commit on), as Patroni's
	// synchronous_mode and CloudNativePG's synchronous replicas run it.
	synchronous replication = "sync"
	// asynchronous: the standby trails the primary.
	asynchronous replication = "async"
	// single: a server of the scenario's own, with no standby.
	single replication = "single"
)

// standbyName is the standby's application_name.
const standbyName = "s1"

// pgPair is a scenario's own PostgreSQL primary and streaming standby (none
// when single). The
// processes reach them by a multi-host DSN that picks whichever accepts
// writes (target_session_attrs=read-write), so a promoted standby is found
// without a restart.
type pgPair struct {
	primary, standby *pgtest.Server
}

// startPair starts a primary and its standby, made durable as production
// runs them (synchronous_commit on, so that a crash loses no commit).
func startPair(t *testing.T, mode replication) *pgPair {
	t.Helper()
	p := &pgPair{primary: pgtest.StartServer(t, pgtest.ServerOptions{Settings: map[string]string{
		"synchronous_commit": "on", "max_connections": "200"}})}
	if mode == single {
		return p
	}
	p.standby = p.primary.StartStandby(t, standbyName)
	if mode == synchronous {
		// After the base backup: the standby, once promoted, does not wait
		// for a standby of its own.
		p.primary.Reconfigure(t, map[string]string{"synchronous_standby_names": standbyName})
	}
	p.primary.WaitReplayed(t, p.standby)
	return p
}

// dsn is the keyword DSN of database name on both servers, primary first.
func (p *pgPair) dsn(name string) string {
	return fmt.Sprintf("host=%s,%s port=%d,%d user=postgres dbname=%s sslmode=disable target_session_attrs=read-write connect_timeout=5",
		p.primary.Host, p.standby.Host, p.primary.Port, p.standby.Port, name)
}

// failover kills the primary as a machine's crash would and promotes the
// standby, as Patroni or CloudNativePG does.
func (p *pgPair) failover(t *testing.T) {
	t.Helper()
	p.primary.Kill(t)
	p.standby.Promote(t)
}

// syncFailover: under traffic, the primary of a synchronous pair crashes and
// its standby is promoted. The processes follow the new primary by their
// multi-host DSN without a restart; nothing acknowledged is lost, and no
// record on the topic lacks its row (0 phantoms): the checker's rules.
func syncFailover(t *testing.T, e *env) int {
	tr := e.drive(100, 0.2)
	tr.waitCreated(100, 30*time.Second, "before the failover")
	start := time.Now()
	e.pair.failover(t)
	e.fault()
	if !e.waitReady(2 * time.Minute) {
		e.violate("the processes did not become ready on the promoted standby without a restart")
	}
	tr.waitCreated(50, time.Minute, "after the failover")
	e.detail = fmt.Sprintf("ready again %s after the crash", time.Since(start).Round(100*time.Millisecond))
	tr.halt()
	t.Logf("traffic: %s", tr)
	return int(tr.created.Load())*2 + int(tr.cancels.Load())
}

// standbyAtPrimaryAddress: the address the processes use (a proxy here; a
// DNS name or a virtual IP in production) is moved to a hot standby, as
// after a failover whose old primary came back as a standby. Every write is
// refused read-only: the API answers 503 with Retry-After, never 500, and
// the promotion processes' /readyz is false. Once that standby is promoted,
// they write again without a restart.
func standbyAtPrimaryAddress(t *testing.T, e *env) int {
	tr := e.drive(100, 0.2)
	tr.waitCreated(100, 30*time.Second, "before the move")
	unavailable := tr.unavailable.Load()
	e.pgProxy.Redirect(e.pair.standbyAddr())
	e.fault()
	e.waitUnready(e.promotions, time.Minute)
	if _, ok := eventually(e.ctx, 30*time.Second, func() bool { return tr.unavailable.Load() > unavailable+20 }); !ok {
		e.violate("writes to a standby did not answer 503 (%d 503 answers)", tr.unavailable.Load()-unavailable)
	}
	start := time.Now()
	e.pair.failover(t)
	if !e.waitReady(2 * time.Minute) {
		e.violate("the processes did not become ready after the standby's promotion without a restart")
	}
	tr.waitCreated(50, time.Minute, "after the promotion")
	e.detail = fmt.Sprintf("%d 503 answers on the standby; ready again %s after the promotion",
		tr.unavailable.Load()-unavailable, time.Since(start).Round(100*time.Millisecond))
	tr.halt()
	t.Logf("traffic: %s", tr)
	return int(tr.created.Load())*2 + int(tr.cancels.Load())
}

// standbyAddr is the standby's host:port.
func (p *pgPair) standbyAddr() string { return fmt.Sprintf("%s:%d", p.standby.Host, p.standby.Port) }
