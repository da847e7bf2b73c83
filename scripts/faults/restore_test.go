//go:build faults

package faults

import (
	"fmt"
	"testing"
	"time"

	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// restoreIntoFreshCluster: the database is dumped and restored into a fresh
// cluster (a new system identifier, transaction ids far behind the old
// cluster's), and the processes' address moves to it, as a restore behind
// one DNS name does. The dump holds outbox rows that were never published
// (the relays were cut off from Kafka), and the catalog's projection in it
// is older than the consumer group's committed offsets. After the move,
// traffic goes on: every row of the restored outbox and every new one is
// published, none is deleted before, and the catalog re-applies what its
// restored projection lacks. Nothing acknowledged is lost: traffic pauses
// between the dump and the move, as an operator's cutover does.
func restoreIntoFreshCluster(t *testing.T, e *env) int {
	tr := e.drive(100, 0.2)
	tr.waitCreated(100, 30*time.Second, "before the dump")
	e.cutKafka()
	tr.waitCreated(50, 30*time.Second, "with the relays cut off from Kafka")
	tr.halt()
	t.Logf("traffic before the dump: %s", tr)

	fresh := pgtest.StartServer(t, pgtest.ServerOptions{Settings: map[string]string{
		"synchronous_commit": "on", "max_connections": "200"}})
	e.pair.primary.CopyDatabase(t, e.dbName, fresh, e.dbName)
	e.pair.primary.Kill(t)
	e.pgProxy.Redirect(fmt.Sprintf("%s:%d", fresh.Host, fresh.Port))
	moved := time.Now()
	e.fault()
	e.healKafka()
	relayed := e.relayedTotal()
	if _, ok := eventually(e.ctx, 2*time.Minute, func() bool { return e.relayedTotal() > relayed }); !ok {
		e.violate("no row was published within 2 minutes of the restore")
	}
	took := time.Since(moved)
	tr2 := e.drive(100, 0.2)
	tr2.waitCreated(50, time.Minute, "after the restore")
	tr2.halt()
	t.Logf("traffic after the restore: %s", tr2)
	e.detail = fmt.Sprintf("first row published %s after the move", took.Round(10*time.Millisecond))
	return int(tr.created.Load()+tr2.created.Load())*2 + int(tr.cancels.Load()+tr2.cancels.Load())
}
