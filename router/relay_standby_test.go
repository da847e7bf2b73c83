package router_test

import (
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestRelay_PublishesOnlyWhatTheStandbyFlushed: with RELAY_STANDBY_FLUSH
// naming a standby, an event committed while that standby is cut off from
// the primary stays off Kafka, however long the cut lasts (a failover then
// would lose its change: a phantom), and reaches Kafka once the standby has
// it again.
func TestRelay_PublishesOnlyWhatTheStandbyFlushed(t *testing.T) {
	b, standby := startStandbyFlushRelay(t, router.PromotionConfig{RelayPublishTimeout: 2 * time.Second})

	writeOutbox(t, b, purchaseEvents(t, 2, "standby-attached"))
	require.Eventually(t, func() bool { return catalogtest.TopicSize(t, b.topic) == 2 }, 30*time.Second, 20*time.Millisecond,
		"events the standby has are published")

	standby.Detach(t)
	writeOutbox(t, b, purchaseEvents(t, 3, "standby-detached"), purchaseEvents(t, 1, "standby-detached"))
	// Two ack deadlines of the relay (2s + 2s each): it read the page again
	// and was held again.
	require.Never(t, func() bool { return catalogtest.TopicSize(t, b.topic) > 2 }, 8*time.Second, 100*time.Millisecond,
		"an event the detached standby has not flushed reached Kafka")
	require.Equal(t, 1.0, testutil.ToFloat64(b.metrics.OutboxStandbyHeld), "the relay reports that the standby holds it back")

	standby.Attach(t)
	require.Eventually(t, func() bool { return catalogtest.TopicSize(t, b.topic) == 6 }, time.Minute, 50*time.Millisecond,
		"the events are published once the standby has them")
	require.Eventually(t, func() bool { return testutil.ToFloat64(b.metrics.OutboxStandbyHeld) == 0 }, 30*time.Second, 20*time.Millisecond)
	require.Positive(t, testutil.CollectAndCount(b.metrics.OutboxStandbyWait))
}

// BenchmarkRelayStandbyFlushLatency measures what RELAY_STANDBY_FLUSH costs:
// commit → Kafka (the record's timestamp, the relay's produce time) of
// events written one transaction each at a fixed rate, with the mode off and
// naming the one standby of a private primary, in one run on one server
// (fsync off on both, synchronous_commit on; the outbox polled every 20ms). PROMOFLOW_LATENCY_WINDOW
// sets the time each mode writes (default 20s, 5s with -short).
func BenchmarkRelayStandbyFlushLatency(b *testing.B) {
	window := 20 * time.Second
	if testing.Short() {
		window = 5 * time.Second
	}
	if v := os.Getenv("PROMOFLOW_LATENCY_WINDOW"); v != "" {
		var err error
		window, err = time.ParseDuration(v)
		require.NoError(b, err, "PROMOFLOW_LATENCY_WINDOW")
	}
	const rate = 50 // events a second
	// synchronous_commit=on, PostgreSQL's default: off leaves a commit's WAL
	// unwritten for up to 3 × wal_writer_delay, and the standby cannot have
	// it before (p50 311ms against 14ms off, in a run of 50/s for 20s).
	srv := pgtest.StartServer(b, pgtest.ServerOptions{Settings: map[string]string{"synchronous_commit": "on"}})
	srv.StartStandby(b, "replica1")
	for _, mode := range []string{"off", "replica1"} {
		b.Run("standby-flush="+mode, func(b *testing.B) {
			var standbys outbox.Standbys
			require.NoError(b, standbys.Set(mode))
			var delays []time.Duration
			for range b.N {
				db := pgtest.Open(b, pgtest.DatabaseURLOn(b, srv.URL("sslmode=disable")))
				r := catalogtest.StartRelayWith(b, db, router.PromotionConfig{RelayStandbyFlush: standbys})
				stop := r.SendEvery(b, time.Second/rate, func() string { return mode })
				time.Sleep(window) // the load's duration, not a wait for a condition
				stop()
				delays = append(delays, r.Delays(b)...)
			}
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			b.ReportMetric(ms(percentile(delays, .5)), "kafka-p50-ms")
			b.ReportMetric(ms(percentile(delays, .99)), "kafka-p99-ms")
			b.ReportMetric(ms(slices.Max(delays)), "kafka-max-ms")
			b.Logf("standby flush %s: %d events at %d/s: commit→Kafka p50 %s p99 %s max %s; %s", mode, len(delays), rate,
				percentile(delays, .5), percentile(delays, .99), slices.Max(delays), loadAverage())
		})
	}
}

// TestRelay_StandbyWaitKeepsItsPositionSession: a relay that waits for a
// standby holds its position transaction up to the ack deadline, longer than
// PostgreSQL's idle limit for it (which ends a frozen holder's session): the
// wait keeps that session, and another process does not take a position
// whose holder is healthy.
func TestRelay_StandbyWaitKeepsItsPositionSession(t *testing.T) {
	b, standby := startStandbyFlushRelay(t, router.PromotionConfig{})
	standby.Detach(t)
	writeOutbox(t, b, purchaseEvents(t, 1, "standby-wait"))
	var pid int
	require.Eventually(t, func() bool {
		var err error
		pid, err = holderPid(b.db)
		return err == nil
	}, 30*time.Second, 10*time.Millisecond, "the relay holds the position while it waits for the standby")
	// The ack deadline is 12 s after the read; the idle limit is 4 s.
	require.Never(t, func() bool {
		var n int
		return b.db.Get(&n, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid) == nil && n == 0
	}, 7*time.Second, 50*time.Millisecond, "the relay's position session (pid %d) ended while it waited for the standby", pid)
	standby.Attach(t)
	require.Eventually(t, func() bool { return catalogtest.TopicSize(t, b.topic) == 1 }, time.Minute, 50*time.Millisecond,
		"the event is published once the standby has it")
}

// startStandbyFlushRelay runs a promotion process on a private primary with
// RELAY_STANDBY_FLUSH naming its one standby, replica1.
func startStandbyFlushRelay(t *testing.T, cfg router.PromotionConfig) (promotionBundle, *pgtest.Server) {
	t.Helper()
	t.Parallel()
	srv := pgtest.StartServer(t, pgtest.ServerOptions{})
	standby := srv.StartStandby(t, "replica1")
	b := promotionBundle{db: pgtest.Open(t, pgtest.DatabaseURLOn(t, srv.URL("sslmode=disable"))), topic: kafkatest.Topic(t, 1)}
	require.NoError(t, cfg.RelayStandbyFlush.Set("replica1"))
	b.startRouter(t, cfg, expire.Config{Interval: time.Hour}, slog.New(slog.DiscardHandler))
	return b, standby
}
