package rebuild_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/rebuild"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// holdRecords is how many records TestRebuild_DoesNotHoldTheRelayBack
// rebuilds from: the read and the load of as many in one transaction each
// held an xid for 5.7 s and 3.4 s on this machine.
const holdRecords = 200_000

// holdMost is the longest a transaction of the rebuild may hold an xid, and
// a promotion event may take from its commit to the topic.
const holdMost = 2 * time.Second

// TestRebuild_DoesNotHoldTheRelayBack: a rebuild of 200,000 records, with
// records arriving for its catch-up, on a PostgreSQL server of the test's
// own that also runs a promotion process's relay (the relay reads only the
// outbox rows below the server's oldest transaction holding an xid). At
// every point of the rebuild and every 200 ms a purchase's event is written
// to the outbox; pg_stat_activity is sampled every 20 ms for the rebuild's
// sessions. In every phase, no transaction of the rebuild holds an xid for
// longer than 2 s, and every event reaches the topic within 2 s of its
// commit.
func TestRebuild_DoesNotHoldTheRelayBack(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartServer(t, pgtest.ServerOptions{})
	b := catalogtest.NewOn(t, srv.URL("sslmode=disable"), true)
	bulk := catalogtest.NewBulk(t, b)
	bulk.Produce(t, b.Cfg.Topic, holdRecords)
	relay := catalogtest.StartRelay(t, b.DB)

	const app = "promoflow-rebuild-test"
	rb, err := rebuild.New(rebuild.Config{DB: pgtest.Open(t, srv.URL("sslmode=disable&application_name="+app)),
		Kafka: b.Cfg.Kafka, Topic: b.Cfg.Topic, Log: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(rb.Stop)
	phase := func() string {
		live, ok := rb.Live()
		if !ok {
			return "no phase"
		}
		return live.Phase
	}
	var once sync.Once
	rb.SetHook(func(_ context.Context, at rebuild.Point) error {
		if at == rebuild.PointEnds {
			once.Do(func() { bulk.Produce(t, b.Cfg.Topic, 2000) }) // for the catch-up
		}
		assert.NoError(t, relay.Send(phase()+" at "+string(at)))
		return nil
	})
	holds := pgtest.WatchXids(t, b.DB, app, phase)
	stopSending := relay.SendEvery(t, 200*time.Millisecond, phase)

	st, err := rb.Run(context.Background())
	stopSending()
	seen := holds()

	require.NoError(t, err)
	require.Equal(t, rebuild.StateDone, st.State)
	require.EqualValues(t, holdRecords+2000, st.Read)
	longest := pgtest.RequireXidsHeldAtMost(t, seen, holdMost, "the rebuild")
	labels, delay := relay.RequireDelays(t, holdMost)
	for _, p := range []rebuild.Phase{rebuild.PhaseRead, rebuild.PhaseLoad, rebuild.PhaseCompute, rebuild.PhaseCatchUp, rebuild.PhaseSwitch} {
		sentIn := 0
		for label, n := range labels {
			if strings.HasPrefix(label, string(p)) {
				sentIn += n
			}
		}
		require.Positive(t, sentIn, "an event was sent during the %s phase (%v)", p, labels)
	}
	t.Logf("events sent by phase: %v, the longest on the topic %s after its commit; %d transactions of the rebuild "+
		"held an xid, the longest %s", labels, delay.Round(time.Millisecond), len(seen), longest)
}
