package router_test

import (
	"context"
	"log/slog"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/purchase"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// Load of BenchmarkExpiryLatency: expiries per second, and the time allowed
// to create the purchases and boost their cards before the first EndsAt.
const (
	latencyRate             = 100
	latencySetup            = 10 * time.Second
	latencySetupPerPurchase = 6 * time.Millisecond
)

// BenchmarkExpiryLatency measures how late past its EndsAt a purchase stops
// boosting, with EXPIRE_INTERVAL=60s, so that every expiry comes from the
// wake-up: EndsAt → Expired record on Kafka (its timestamp, the relay's
// produce time) and EndsAt → the card's boost back to 0 (polled every 10ms
// with the catalog's replica of the purchase).
// It reports AsOf − EndsAt too (the expirer alone), the cycles run and their
// mean duration (the cost of the wake-ups). One promotion router and one
// catalog router with the shipped settings on the real stack; 100 expiries/s for 30s,
// each purchase on a card of its own, all created (and their cards boosted)
// before the window with EndsAt spread over it. With -short, or
// PROMOFLOW_LATENCY_WINDOW=5s, the window is short enough for CI: it reports
// the figures and asserts no timing.
//
// neighbour=another-database runs the same beside a transaction in another
// database of the server that holds a transaction id from before the
// purchases are created until every card is back to 0 (what a batch job or a
// session left idle in a transaction does): it reports how long it held one.
func BenchmarkExpiryLatency(b *testing.B) {
	for _, neighbour := range []bool{false, true} {
		name := "neighbour=none"
		if neighbour {
			name = "neighbour=another-database"
		}
		b.Run(name, func(b *testing.B) { benchmarkExpiryLatency(b, neighbour) })
	}
}

func benchmarkExpiryLatency(b *testing.B, neighbour bool) {
	window := 30 * time.Second
	if testing.Short() {
		window = 5 * time.Second
	}
	if v := os.Getenv("PROMOFLOW_LATENCY_WINDOW"); v != "" {
		var err error
		window, err = time.ParseDuration(v)
		require.NoError(b, err, "PROMOFLOW_LATENCY_WINDOW")
	}
	var all latencyRun
	var held time.Duration
	for range b.N {
		var other *sqlx.DB
		var xid int64
		since := time.Now()
		if neighbour {
			other = pgtest.Open(b, pgtest.DatabaseURL(b))
			xid = holdXid(b, other, `CREATE TEMP TABLE t (i int); INSERT INTO t VALUES (1)`, "")
		}
		r := runExpiryLatency(b, window)
		if neighbour {
			var running int
			require.NoError(b, other.Get(&running, `SELECT count(*) FROM pg_stat_activity WHERE backend_xid::text::bigint = $1`, xid%(1<<32)))
			require.Equal(b, 1, running, "the neighbour held its transaction id all along")
			held += time.Since(since)
		}
		all.toKafka = append(all.toKafka, r.toKafka...)
		all.toCard = append(all.toCard, r.toCard...)
		all.asOf = append(all.asOf, r.asOf...)
		all.cycles += r.cycles
		all.cycleSecs += r.cycleSecs
		all.consumed += r.consumed
		all.consumeMs += r.consumeMs
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for _, f := range []struct {
		name string
		ds   []time.Duration
	}{{"asof", all.asOf}, {"kafka", all.toKafka}, {"card", all.toCard}} {
		b.ReportMetric(ms(percentile(f.ds, 0.50)), f.name+"-p50-ms")
		b.ReportMetric(ms(percentile(f.ds, 0.99)), f.name+"-p99-ms")
		b.ReportMetric(ms(slices.Max(f.ds)), f.name+"-max-ms")
	}
	if neighbour {
		b.ReportMetric(held.Seconds()/float64(b.N), "neighbour-held-s")
	}
	b.ReportMetric(float64(all.cycles)/float64(b.N), "cycles/run")
	b.ReportMetric(all.cycleSecs*1000/float64(all.cycles), "ms/cycle")
	b.ReportMetric(all.consumeMs/float64(all.consumed), "catalog-ms/event")
	b.Logf("window %s, %d expiries: EndsAt→AsOf p50 %s p99 %s; →Kafka p50 %s p99 %s; →card p50 %s p99 %s; "+
		"%d cycles, %.1f ms each; catalog %.1f ms/event; %s",
		window, len(all.asOf), percentile(all.asOf, .5), percentile(all.asOf, .99), percentile(all.toKafka, .5),
		percentile(all.toKafka, .99), percentile(all.toCard, .5), percentile(all.toCard, .99), all.cycles,
		all.cycleSecs*1000/float64(all.cycles), all.consumeMs/float64(all.consumed), loadAverage())
}

// loadAverage is the machine's load, to read the figures by: on a shared
// machine other work delays the routers too.
func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "load average unknown"
	}
	return "load average " + strings.Join(strings.Fields(string(raw))[:3], " ")
}

// latencyRun is what one run measured, one delay per purchase.
type latencyRun struct {
	asOf, toKafka, toCard []time.Duration
	cycles                uint64
	cycleSecs             float64
	// consumed is how many events the catalog handled, in consumeMs in all.
	consumed  uint64
	consumeMs float64
}

func runExpiryLatency(b *testing.B, window time.Duration) latencyRun {
	c := catalogtest.New(b, true)
	p := promotionBundle{db: c.DB, topic: c.Cfg.Topic}
	n := int(window.Seconds() * latencyRate)
	cards := make([]uuid.UUID, n)
	for i := range cards {
		cards[i] = uuid.New()
		c.ProjectCard(b, cards[i])
	}
	// The shipped settings: a 60s interval (every expiry comes from the
	// wake-up) and the outbox polled every 100ms.
	p.startRouter(b, router.PromotionConfig{OutboxPollInterval: router.OutboxPollIntervalDefault},
		expire.Config{Interval: heartbeat}, slog.New(slog.DiscardHandler))
	c.Start(b)

	// Purchase i ends at first + i/rate. Every purchase is created, and its
	// card boosted, before the first EndsAt, so that only expiries run in
	// the window.
	first := time.Now().Add(latencySetup + time.Duration(n)*latencySetupPerPurchase).Truncate(time.Millisecond)
	endsAt := func(i int) time.Time { return first.Add(time.Duration(i) * time.Second / latencyRate) }
	ids := createPurchases(b, purchasetest.NewService(b, c.DB, c.Cfg.Topic), cards, endsAt)
	require.Eventually(b, func() bool {
		var boosted int
		return c.DB.Get(&boosted, `SELECT count(*) FROM catalog.project_cards WHERE promotion_boost > 0`) == nil && boosted == n
	}, time.Until(first), 10*time.Millisecond, "every card is boosted before the first EndsAt; raise latencySetupPerPurchase")

	unboosted := watchCards(b, c, ids, endsAt, window+2*time.Minute)
	run := latencyRun{}
	byPurchase := make(map[uuid.UUID]int, n)
	for i, id := range ids {
		byPurchase[id] = i
		run.toCard = append(run.toCard, unboosted[i].Sub(endsAt(i)))
	}
	for _, rec := range readExpired(b, c.Cfg.Topic, n) {
		run.toKafka = append(run.toKafka, rec.Timestamp.Sub(endsAt(byPurchase[rec.id])))
	}
	var rows []struct {
		EndsAt    time.Time `db:"ends_at"`
		UpdatedAt time.Time `db:"updated_at"`
	}
	require.NoError(b, c.DB.Select(&rows, `SELECT ends_at, updated_at FROM promotion.promotion_purchases WHERE status = 'Expired'`))
	require.Len(b, rows, n)
	for _, r := range rows {
		run.asOf = append(run.asOf, r.UpdatedAt.Sub(r.EndsAt))
	}
	run.cycles, run.cycleSecs = histogramCountSum(b, p.metrics.CycleDuration)
	run.consumed, run.consumeMs = histogramCountSum(b, c.Metrics.ConsumeDuration)
	return run
}

// createPurchases creates purchase i on cards[i], ending at endsAt(i),
// through the API's use case, four at a time, and returns their ids.
func createPurchases(b *testing.B, svc *purchase.Service, cards []uuid.UUID, endsAt func(int) time.Time) []uuid.UUID {
	ids := make([]uuid.UUID, len(cards))
	todo := make(chan int)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range todo {
				got, _, err := svc.Create(context.Background(), uuid.New(), "", purchase.Draft{PackageKind: "Top", BoostWeight: 10,
					Targets: []event.Target{catalogtest.Target(event.TargetProject, cards[i])}, EndsAt: endsAt(i)}, "bench")
				if err != nil {
					b.Errorf("create purchase %d: %v", i, err)
					continue
				}
				ids[i] = got.ID
			}
		}()
	}
	for i := range cards {
		todo <- i
	}
	close(todo)
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	return ids
}

// watchCards polls every 10ms, for the purchases past their EndsAt, whether
// the catalog applied their Expired event and their card is back to boost 0
// (one commit does both), and returns when each was: the start of the first
// poll that saw it. Only purchases past EndsAt are polled, so the poll stays
// small and does not load the machine it measures.
func watchCards(b *testing.B, c *catalogtest.Bundle, ids []uuid.UUID, endsAt func(int) time.Time, timeout time.Duration) []time.Time {
	n := len(ids)
	unboosted := make([]time.Time, n)
	idx := make(map[uuid.UUID]int, n)
	for i, id := range ids {
		idx[id] = i
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(timeout)
	for left := n; left > 0; {
		select {
		case <-tick.C:
		case <-deadline:
			b.Fatalf("%d of %d cards still boosted after %s", left, n, timeout)
		}
		polled := time.Now()
		var pending []string
		for i, id := range ids {
			if unboosted[i].IsZero() && !polled.Before(endsAt(i)) {
				pending = append(pending, id.String())
			}
		}
		var done []uuid.UUID
		require.NoError(b, c.DB.Select(&done, `SELECT k.purchase_id FROM catalog.promotion_contributions k
			JOIN catalog.project_cards p ON p.id = k.target_id
			WHERE k.purchase_id = ANY($1::uuid[]) AND k.status = 'Expired' AND p.promotion_boost = 0`, pq.Array(pending)))
		for _, id := range done {
			unboosted[idx[id]] = polled
			left--
		}
	}
	return unboosted
}

// expiredRecord is an Expired record on the purchase topic.
type expiredRecord struct {
	*sarama.ConsumerMessage
	id uuid.UUID
}

// readExpired reads the topic until n Expired records have arrived.
func readExpired(b *testing.B, topic string, n int) []expiredRecord {
	var out []expiredRecord
	read := 0
	kafkatest.ReadTopic(b, topic, 2*time.Minute, func(ms []*sarama.ConsumerMessage) bool {
		for ; read < len(ms); read++ {
			if ev, err := event.Parse(ms[read].Value); err == nil && ev.Status == event.StatusExpired {
				out = append(out, expiredRecord{ms[read], ev.PurchaseId})
			}
		}
		return len(out) >= n
	})
	return out
}

// percentile is the q-quantile of ds (nearest rank).
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[max(0, int(math.Ceil(q*float64(len(s))))-1)]
}
