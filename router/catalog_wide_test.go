package router_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestCatalog_WideEventsAtOnceAllApply: three events of 12,000 targets each,
// on the same cards and on three partitions, applied at once by three
// concurrent workers on a server of PostgreSQL's default
// max_locks_per_transaction (64), whose shared lock table holds one such
// event's per-target locks but not three: every event applies, each in one
// transaction, none is dead-lettered, and no transaction holds more than the
// striped lock bound.
func TestCatalog_WideEventsAtOnceAllApply(t *testing.T) {
	const (
		projects, objects = 2_000, 10_000
		perTransaction    = 64 // default max_locks_per_transaction
	)
	server := pgtest.StartServer(t, pgtest.ServerOptions{Settings: map[string]string{
		"max_connections": "100", "max_locks_per_transaction": "64"}}) // PostgreSQL's defaults
	b := catalogtest.NewOn(t, server.URL("sslmode=disable"), true)
	b.Cfg.Workers = 3

	var targets []event.Target
	projectIDs, objectIDs, homes := make([]uuid.UUID, projects), make([]uuid.UUID, objects), make([]uuid.UUID, objects)
	for i := range projectIDs {
		projectIDs[i] = uuid.New()
		targets = append(targets, catalogtest.Target(event.TargetProject, projectIDs[i]))
	}
	for i := range objectIDs {
		objectIDs[i], homes[i] = uuid.New(), uuid.New() // homes are no target: no cascade
		targets = append(targets, catalogtest.Target(event.TargetPropertyObject, objectIDs[i]))
	}
	b.InsertCards(t, projectIDs, objectIDs, homes)

	// One event a partition, so that the three workers apply them at once.
	hash := sarama.NewHashPartitioner(b.Cfg.Topic)
	taken := map[int32]bool{}
	want := 0
	for weight := 1; len(taken) < 3; {
		ev := catalogtest.PurchaseEvent(event.StatusActive, 1, weight, targets...)
		p, err := hash.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(ev.PurchaseId.String())}, 3)
		require.NoError(t, err)
		if taken[p] {
			continue
		}
		taken[p] = true
		b.Produce(t, ev)
		want += weight
		weight++
	}

	// The most locks one backend holds in the shared lock table (fast-path
	// relation locks are not in it), sampled while the events apply.
	var peak atomic.Int64
	stopSampling := sampleEvery(t, 5*time.Millisecond, func(ctx context.Context) {
		var n int64
		if err := b.DB.GetContext(ctx, &n, `SELECT coalesce(max(c), 0) FROM (
			SELECT count(*) AS c FROM pg_locks WHERE NOT fastpath AND pid <> pg_backend_pid() GROUP BY pid) x`); err == nil && n > peak.Load() {
			peak.Store(n)
		}
	})
	start := time.Now()
	b.Start(t)

	applied := func() (n int) {
		require.NoError(t, b.DB.Get(&n, `SELECT (SELECT count(*) FROM catalog.project_cards WHERE promotion_boost = $1)
			+ (SELECT count(*) FROM catalog.property_object_cards WHERE promotion_boost = $1)`, want))
		return n
	}
	require.Eventually(t, func() bool { return applied() == projects+objects || testutil.ToFloat64(b.Metrics.DLQ) > 0 },
		60*time.Second, 50*time.Millisecond, "the three events did not all apply within 60s")
	stopSampling()
	require.Zero(t, testutil.ToFloat64(b.Metrics.DLQ), "a valid wide event was dead-lettered")
	require.Equal(t, projects+objects, applied(), "cards with the boost of all three events (%d)", want)
	require.LessOrEqual(t, peak.Load(), int64(perTransaction),
		"one transaction held more locks than max_locks_per_transaction")
	t.Logf("3 events of %d targets applied in %s; peak locks of one backend: %d",
		projects+objects, time.Since(start).Round(time.Millisecond), peak.Load())
}
