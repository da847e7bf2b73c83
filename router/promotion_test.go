package router_test

import (
	"cmp"
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

type promotionBundle struct {
	db      *sqlx.DB
	topic   string
	metrics *router.PromotionMetrics
}

func setupPromotion(t *testing.T, partitions int32) promotionBundle {
	t.Helper()
	t.Parallel()
	return promotionBundle{db: pgtest.DB(t), topic: kafkatest.Topic(t, partitions)}
}

// start runs one promotion router (one process's worth) until the test ends.
func (b *promotionBundle) start(t testing.TB, interval time.Duration) {
	t.Helper()
	b.startWith(t, interval, expire.Config{}, slog.New(slog.DiscardHandler))
}

// startWith is start with the expirer's config (its topic is the bundle's)
// and a logger of the test's choosing.
func (b *promotionBundle) startWith(t testing.TB, interval time.Duration, cfg expire.Config, log *slog.Logger) {
	t.Helper()
	cfg.Interval = interval
	b.startRouter(t, router.PromotionConfig{}, cfg, log)
}

// startRouter is startWith with the router's config: its brokers, and short
// janitor and poll intervals where it sets none, are filled in. The returned
// stop stops the router before the test ends.
func (b *promotionBundle) startRouter(t testing.TB, rcfg router.PromotionConfig, cfg expire.Config, log *slog.Logger) (stop func()) {
	t.Helper()
	cfg.Topic = b.topic
	exp, err := expire.New(b.db, cfg, log)
	require.NoError(t, err)
	m, err := router.NewPromotionMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	b.metrics = m
	rcfg.Kafka = kafkatest.Cluster(t)
	rcfg.JanitorInterval = cmp.Or(rcfg.JanitorInterval, 200*time.Millisecond)
	rcfg.OutboxPollInterval = cmp.Or(rcfg.OutboxPollInterval, 20*time.Millisecond)
	p, err := router.NewPromotion(b.db, exp, m, log, rcfg)
	require.NoError(t, err)
	return catalogtest.RunUntilCleanup(t, p.Run, p.Router.IsRunning)
}

func TestPromotion_ExpiredPurchaseEventIsPublishedToKafka(t *testing.T) {
	b := setupPromotion(t, 3)
	due := purchasetest.SeedActive(t, b.db, 3, time.Now().Add(-time.Minute))
	b.start(t, 100*time.Millisecond)

	msgs := kafkatest.ReadTopic(t, b.topic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 3 })
	seen := map[uuid.UUID]bool{}
	for _, m := range msgs {
		ev, err := event.Parse(m.Value)
		require.NoError(t, err)
		require.Equal(t, event.StatusExpired, ev.Status)
		require.EqualValues(t, 2, ev.Version)
		require.Equal(t, ev.PurchaseId.String(), string(m.Key), "record key = PurchaseId")
		require.Equal(t, "1", kafkatest.Header(m, event.HeaderContractVersion))
		require.Equal(t, event.EventType, kafkatest.Header(m, event.HeaderEventType))
		require.Equal(t, event.AggregateType, kafkatest.Header(m, event.HeaderAggregateType))
		require.Equal(t, ev.PurchaseId.String(), kafkatest.Header(m, event.HeaderAggregateID))
		require.Equal(t, ev.TenantId.String(), kafkatest.Header(m, event.HeaderTenantID))
		require.NotEmpty(t, kafkatest.Header(m, event.HeaderCorrelationID))
		require.NotEmpty(t, kafkatest.Header(m, event.HeaderOccurredAt))
		require.NotEmpty(t, kafkatest.Header(m, "_watermill_message_uuid"), "the MessageId travels with the record")
		seen[ev.PurchaseId] = true
	}
	for _, id := range due {
		require.True(t, seen[id])
	}
}

// TestPromotion_AccuracySLOHolds runs before the parallel tests (it does not
// call t.Parallel), so that their load on the shared cluster does not blur the timing.
func TestPromotion_AccuracySLOHolds(t *testing.T) {
	b := promotionBundle{db: pgtest.DB(t), topic: kafkatest.Topic(t, 1)}
	// Interval in the seed is 1-5 min; 2s keeps the test short yet above the
	// relay delays that other tests sharing the PostgreSQL cluster cause.
	const interval = 2 * time.Second
	start := time.Now()
	// EndsAt spread over the next three seconds.
	var ids []uuid.UUID
	for i := range 6 {
		ids = append(ids, purchasetest.SeedActive(t, b.db, 1, start.Add(time.Duration(i)*500*time.Millisecond))...)
	}
	b.start(t, interval)

	// The record timestamp is the relay's produce time.
	published := map[uuid.UUID]time.Time{}
	kafkatest.ReadTopic(t, b.topic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool {
		for _, m := range ms {
			if ev, err := event.Parse(m.Value); err == nil {
				published[ev.PurchaseId] = m.Timestamp
			}
		}
		return len(published) == len(ids)
	})
	var rows []struct {
		ID        uuid.UUID `db:"id"`
		EndsAt    time.Time `db:"ends_at"`
		UpdatedAt time.Time `db:"updated_at"`
	}
	require.NoError(t, b.db.Select(&rows, `SELECT id, ends_at, updated_at FROM promotion.promotion_purchases`))
	// Scheduling slack on a shared 2-core machine running the race detector;
	// the rule itself is t + Interval + cycle duration.
	const slack = 500 * time.Millisecond
	for _, r := range rows {
		asOf := r.UpdatedAt
		require.False(t, asOf.Before(r.EndsAt), "never expired early")
		require.LessOrEqual(t, asOf.Sub(r.EndsAt), interval+slack, "expired within one interval of EndsAt")
		require.False(t, published[r.ID].Before(asOf), "published after the transition")
		require.LessOrEqual(t, published[r.ID].Sub(asOf), interval+2*slack, "the Expired event left within one interval")
	}
}

// TestPromotion_ABacklogPastOneCycleIsTakenByCyclesBackToBack: a cycle cut
// by MaxDuration is followed at once by the next, not an Interval later. The
// interval here is an hour and the wake-up is off, and every batch outlasts
// MaxDuration (a statement trigger sleeps), so each cycle takes a batch or
// two: only cycles back to back expire the four purchases in time.
func TestPromotion_ABacklogPastOneCycleIsTakenByCyclesBackToBack(t *testing.T) {
	b := setupPromotion(t, 1)
	purchasetest.SeedActive(t, b.db, 4, time.Now().Add(-time.Minute))
	pgtest.SlowUpdates(t, b.db, "promotion.promotion_purchases", 50*time.Millisecond)
	b.startWith(t, time.Hour, expire.Config{BatchSize: 1, MaxDuration: 10 * time.Millisecond, DisableWakeup: true},
		slog.New(slog.DiscardHandler))

	require.Eventually(t, func() bool {
		return testutil.ToFloat64(b.metrics.Items.WithLabelValues("expired")) == 4
	}, 30*time.Second, 20*time.Millisecond, "the backlog waits for the next interval")
	require.GreaterOrEqual(t, testutil.ToFloat64(b.metrics.RunTotal), 2.0, "more than one cycle took the backlog")
}

// TestPromotion_ACrashMidBurstLosesNoExpiryAndDoublesNone: PostgreSQL
// crashes (an immediate shutdown, then crash recovery) while a cycle's
// batches run side by side on a burst and the relay sends their events.
// Every purchase ends Expired by one transition, and the topic carries its
// Expired event: at least once, and every copy the same event.
func TestPromotion_ACrashMidBurstLosesNoExpiryAndDoublesNone(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartServer(t, pgtest.ServerOptions{Settings: map[string]string{"synchronous_commit": "on"}})
	b := promotionBundle{db: pgtest.Open(t, pgtest.DatabaseURLOn(t, srv.URL("sslmode=disable"))), topic: kafkatest.Topic(t, 3)}
	const n = 20_000
	due := purchasetest.SeedActive(t, b.db, n, time.Now().Add(-time.Minute))
	// 100 batches of 50 ms or more each: the crash finds the burst under way.
	pgtest.SlowUpdates(t, b.db, "promotion.promotion_purchases", 50*time.Millisecond)
	b.start(t, 200*time.Millisecond)

	var before int
	require.Eventually(t, func() bool {
		return b.db.Get(&before, `SELECT count(*) FROM promotion.promotion_purchases WHERE status = 'Expired'`) == nil && before >= 1000
	}, time.Minute, 5*time.Millisecond)
	require.Less(t, before, n, "the crash came after the burst")
	srv.Crash(t)

	require.Eventually(t, func() bool {
		var active int
		return b.db.Get(&active, `SELECT count(*) FROM promotion.promotion_purchases WHERE status = 'Active'`) == nil && active == 0
	}, 2*time.Minute, 50*time.Millisecond, "purchases left Active after the crash")
	for id, st := range purchasetest.Statuses(t, b.db) {
		require.Equal(t, purchasetest.State{Status: event.StatusExpired, Version: 2}, st, "one transition for %s", id)
	}
	seen := make(map[string]event.PurchaseChanged, n)
	read := 0
	kafkatest.ReadTopicWithin(t, b.topic, time.Minute, func(ms []*sarama.ConsumerMessage) bool {
		for _, m := range ms[read:] {
			read++
			ev, err := event.Parse(m.Value)
			require.NoError(t, err)
			if first, ok := seen[string(m.Key)]; ok {
				require.Equal(t, first, ev, "two different events for %s", m.Key)
			}
			seen[string(m.Key)] = ev
		}
		return len(seen) == n
	})
	var missing []string
	for _, id := range due {
		if ev, ok := seen[id.String()]; !ok || ev.Status != event.StatusExpired {
			missing = append(missing, id.String())
		}
	}
	require.Empty(t, missing, "%d of %d purchases expired without their Expired event on the topic (%d records read)", len(missing), n, read)
	t.Logf("%d of %d purchases Expired just before the crash; %d records for %d events; %v expirer failures",
		before, n, read, n, testutil.ToFloat64(b.metrics.Errors.WithLabelValues("infrastructure")))
}

func TestPromotion_TwoInstancesOn5000DuePurchasesEmitExactlyOneEventEach(t *testing.T) {
	b := setupPromotion(t, 6)
	due := purchasetest.SeedActive(t, b.db, 5000, time.Now().Add(-time.Minute))
	b.start(t, 200*time.Millisecond)
	b.start(t, 200*time.Millisecond)

	perPurchase := map[string]int{}
	kafkatest.ReadTopic(t, b.topic, 3*time.Minute, func(ms []*sarama.ConsumerMessage) bool {
		return len(ms) >= len(due)
	})
	// All relayed: the outbox is empty of unacked rows; then nothing else can arrive.
	require.Eventually(t, func() bool {
		var n int
		_ = b.db.Get(&n, `SELECT count(*) FROM promotion.outbox_messages`)
		return n == 0
	}, time.Minute, 50*time.Millisecond, "relayed rows are cleaned up")
	msgs := kafkatest.ReadTopic(t, b.topic, time.Minute, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= len(due) })
	require.Equal(t, len(due), int(catalogtest.TopicSize(t, b.topic)), "no extra record on the topic")
	for _, m := range msgs {
		perPurchase[string(m.Key)]++
	}
	for _, id := range due {
		require.Equal(t, 1, perPurchase[id.String()], "exactly one event for %s", id)
	}
	for id, st := range purchasetest.Statuses(t, b.db) {
		require.Equal(t, purchasetest.State{Status: event.StatusExpired, Version: 2}, st, "exactly one transition for %s", id)
	}
}

func TestPromotion_MetricsReportCyclesAndOutbox(t *testing.T) {
	b := setupPromotion(t, 1)
	purchasetest.SeedActive(t, b.db, 4, time.Now().Add(-time.Minute))
	b.start(t, 100*time.Millisecond)
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(b.metrics.Items.WithLabelValues("expired")) == 4 &&
			testutil.ToFloat64(b.metrics.OutboxRelayed) == 4
	}, 30*time.Second, 20*time.Millisecond)
	require.Positive(t, testutil.ToFloat64(b.metrics.RunTotal))
	// The four expiries were one transaction, so one outbox row: the relayed
	// counter and the backlog count events, the janitor counts rows.
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(b.metrics.OutboxCleaned) == 1 && testutil.ToFloat64(b.metrics.OutboxBacklog) == 0
	}, 30*time.Second, 20*time.Millisecond)
	require.Zero(t, testutil.ToFloat64(b.metrics.Backlog))
}
