package audit_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/audit"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestAuditReplica_DoesNotHoldTheRelayBack: a replica check of 200,000
// records (none consumed yet: every purchase is pending, so the check writes
// one outcome row each) on a PostgreSQL server of the test's own that also
// runs a promotion process's relay (the relay reads only the outbox rows
// below the server's oldest transaction holding an xid). Every 200 ms, and
// once the check read the topic's ends, a purchase's event is written to
// the outbox; pg_stat_activity is sampled every 20 ms for the check's
// sessions. No transaction of the check holds an xid for longer than 2 s,
// and every event reaches the topic within 2 s of its commit. (The check of
// as many records in one transaction held its xid for 8 s on this machine.)
func TestAuditReplica_DoesNotHoldTheRelayBack(t *testing.T) {
	t.Parallel()
	const records, most = 200_000, 2 * time.Second
	srv := pgtest.StartServer(t, pgtest.ServerOptions{})
	b := catalogtest.NewOn(t, srv.URL("sslmode=disable"), true)
	catalogtest.NewBulk(t, b).Produce(t, b.Cfg.Topic, records)
	relay := catalogtest.StartRelay(t, b.DB)

	const app = "promoflow-audit-test"
	a, err := audit.New(audit.Config{DB: pgtest.Open(t, srv.URL("sslmode=disable&application_name="+app)),
		Kafka: b.Cfg.Kafka, Topic: b.Cfg.Topic, ConsumerGroup: b.Cfg.ConsumerGroup, Log: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	a.SetAfterEnds(func(context.Context) error {
		assert.NoError(t, relay.Send("the ends read"))
		return nil
	})
	holds := pgtest.WatchXids(t, b.DB, app, nil)
	stopSending := relay.SendEvery(t, 200*time.Millisecond, func() string { return "the check" })

	rep, err := a.Replica(context.Background())
	stopSending()
	seen := holds()

	require.NoError(t, err)
	require.EqualValues(t, records, rep.Purchases)
	require.EqualValues(t, records, rep.Pending, "the group consumed nothing")
	longest := pgtest.RequireXidsHeldAtMost(t, seen, most, "the check")
	labels, delay := relay.RequireDelays(t, most)
	t.Logf("events sent: %v, the longest on the topic %s after its commit; %d transactions of the check held an xid, "+
		"the longest %s", labels, delay.Round(time.Millisecond), len(seen), longest)
}
