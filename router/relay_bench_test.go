package router_test

import (
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// benchSize is full, or short under -short (what CI can afford with -benchtime 1x).
func benchSize(full, short int) int {
	if testing.Short() {
		return short
	}
	return full
}

// benchEvents is the number of events the variable env names, or
// benchSize(full, short) when it is not set.
func benchEvents(b *testing.B, env string, full, short int) int {
	v := os.Getenv(env)
	if v == "" {
		return benchSize(full, short)
	}
	n, err := strconv.Atoi(v)
	require.NoError(b, err, env)
	require.Positive(b, n, env)
	return n
}

// BenchmarkRelay measures the outbox relay from the SQL outbox to real Kafka
// (acks=all, idempotent) against a bare SendMessages of the same records with
// the same producer config, in the same run. The outbox is written as the
// expirer writes it (200 events per transaction) and as the purchase API does
// (1 per transaction). Reports events/s of both and their ratio, and the
// relay with tracing on (the default sampler, exported over OTLP/HTTP, every
// event with a writer's trace context) beside it off: their ratio is the
// cost of tracing (docs/benchmarks.md). Each of the b.N rounds is a pair of
// the two, in alternating order; it reports the whole run's ratio and the
// median of the pairs' (one pair moves by tens of percent on a shared
// machine: run it with -benchtime 6x or more for the cost of tracing), and
// each side's CPU time per event in this process and in PostgreSQL.
// 20,000 events a side, 2,000 under -short, or PROMOFLOW_RELAY_EVENTS: at
// 200 events a transaction a side of 20,000 lasts under a second.
func BenchmarkRelay(b *testing.B) {
	withoutSpanRecording(b)
	n := benchEvents(b, "PROMOFLOW_RELAY_EVENTS", 20_000, 2_000)
	for _, perTx := range []int{expire.BatchSizeDefault, 1} {
		b.Run(fmt.Sprintf("events-per-tx=%d", perTx), func(b *testing.B) {
			var bareSecs, relaySecs, tracedSecs, peakMB float64
			var ratios []float64
			var offCPU, onCPU cpuPerEvent
			// Alternate which side goes first, so neither always meets a warmer broker.
			for i := range b.N {
				if i%2 == 0 {
					bareSecs += bareSend(b, n)
				}
				off, on := tracingSides(b, i, func() relayRun { return relay(b, n, perTx, 1) })
				relaySecs += off.secs
				tracedSecs += on.secs
				ratios = append(ratios, off.secs/on.secs)
				peakMB = max(peakMB, off.peakMB)
				offCPU.add(off.cpu.events, off.cpu.consumer, off.cpu.postgres, off.cpu.postgresMeasured)
				onCPU.add(on.cpu.events, on.cpu.consumer, on.cpu.postgres, on.cpu.postgresMeasured)
				if i%2 == 1 {
					bareSecs += bareSend(b, n)
				}
			}
			bare := float64(n*b.N) / bareSecs
			got := float64(n*b.N) / relaySecs
			traced := float64(n*b.N) / tracedSecs
			b.ReportMetric(bare, "bare-events/s")
			b.ReportMetric(got, "relay-events/s")
			b.ReportMetric(got/bare, "ratio")
			b.ReportMetric(peakMB, "relay-peak-rss-MB")
			b.ReportMetric(traced, "relay-traced-events/s")
			b.ReportMetric(traced/got, "tracing-on/off")
			b.ReportMetric(median(ratios), "median-pair-on/off")
			offCPU.reportAs(b, "off-", "relay")
			onCPU.reportAs(b, "on-", "relay")
			b.Logf("each pair's tracing-on/off, in order: %.3f", ratios)
		})
	}
}

// bareSend is the baseline: n records in one SendMessages of a producer with
// the relay's config, to a topic of 6 partitions. It returns the seconds it took.
func bareSend(b *testing.B, n int) float64 {
	topic := kafkatest.Topic(b, 6)
	marshaler := kafka.NewWithPartitioningMarshaler(event.PartitionKey)
	records := make([]*sarama.ProducerMessage, n)
	for i, msg := range benchMessages(b, n) {
		r, err := marshaler.Marshal(topic, msg)
		require.NoError(b, err)
		records[i] = r
	}
	producer, err := sarama.NewSyncProducer(kafkatest.Brokers(b), kafkatest.Cluster(b).DurableProducerConfig("promoflow-bench"))
	require.NoError(b, err)
	defer producer.Close()
	start := time.Now()
	require.NoError(b, producer.SendMessages(records))
	secs := time.Since(start).Seconds()
	require.EqualValues(b, n, catalogtest.TopicSize(b, topic))
	return secs
}

// relayRun is what one run of the relay measured.
type relayRun struct {
	// secs is from the outbox rows becoming visible until every event is relayed.
	secs float64
	// peakMB is the test process's peak RSS meanwhile (MiB), every relay's together.
	peakMB float64
	// relayed is how many events each process relayed.
	relayed []float64
	// cpu is the CPU time the test process (every relay, and on the traced
	// side the exporter and the receiver too) and the database's PostgreSQL
	// backends used meanwhile.
	cpu cpuPerEvent
}

// relay writes n events to the outbox, perTx per transaction, and measures
// how long processes promotion routers take to get them onto a topic of 6
// partitions. Each router has a pool of its own on the database, as separate
// processes have, and its own Kafka producer; their expirers are idle.
func relay(b *testing.B, n, perTx, processes int) relayRun {
	return relayWith(b, n, perTx, processes, func(string) router.PromotionConfig { return router.PromotionConfig{} })
}

// relayWith is relay with each router's config, made for the run's topic.
func relayWith(b *testing.B, n, perTx, processes int, config func(topic string) router.PromotionConfig) relayRun {
	url, topic := pgtest.DatabaseURL(b), kafkatest.Topic(b, 6)
	procs := make([]promotionBundle, processes)
	for i := range procs {
		procs[i] = promotionBundle{db: pgtest.Open(b, url), topic: topic}
	}
	// The relay reads no row of a transaction that began after the oldest
	// outbox writer still open. Holding gate, one, open while the rows are
	// written and the routers start makes them all visible at once at its commit.
	gate, err := outbox.BeginTx(b.Context(), procs[0].db, nil)
	require.NoError(b, err)
	gate.MustExec(`SELECT pg_current_xact_id()`)
	msgs := benchMessages(b, n)
	var txs [][]*message.Message
	for i := 0; i < n; i += perTx {
		txs = append(txs, msgs[i:min(i+perTx, n)])
	}
	traceWrites(txs...)
	writeOutbox(b, procs[0], txs...)
	for i := range procs {
		stop := procs[i].startRouter(b, config(topic), expire.Config{Interval: time.Hour}, slog.New(slog.DiscardHandler))
		defer stop()
	}
	run := relayRun{relayed: make([]float64, processes)}
	relayed := func() float64 {
		var sum float64
		for i, p := range procs {
			run.relayed[i] = testutil.ToFloat64(p.metrics.OutboxRelayed)
			sum += run.relayed[i]
		}
		return sum
	}

	pg := watchPGBackends(b, procs[0].db)
	resetPeakRSS(b)
	selfAt, pgAt := selfCPU(b), pg.CPU()

	start := time.Now()
	require.NoError(b, gate.Commit())
	require.Eventually(b, func() bool { return relayed() >= float64(n) }, 10*time.Minute, time.Millisecond,
		"the relay did not relay the outbox's %d events", n)
	run.secs = time.Since(start).Seconds()
	pg.close()
	run.cpu.add(n, selfCPU(b)-selfAt, pg.CPU()-pgAt, pg != nil)
	run.peakMB = peakRSSMB(b)
	require.EqualValues(b, n, catalogtest.TopicSize(b, topic), "the topic holds each of the outbox's events once")
	return run
}

// benchMessages are the Expired events of n purchases.
func benchMessages(b *testing.B, n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		ev := catalogtest.PurchaseEvent(event.StatusExpired, 2, 10, catalogtest.Target(event.TargetProject, uuid.New()))
		msg, err := event.NewMessage(ev, "bench", time.Now())
		require.NoError(b, err)
		msgs[i] = msg
	}
	return msgs
}

// BenchmarkBurst measures a burst of due purchases through one promotion
// router built as a process builds it (router.NewPromotion, its default
// intervals and batch sizes): from the router's start until every purchase is
// Expired and every event is on Kafka. It reports the seconds, when the last
// purchase was Expired (the expirer's share; the relay works meanwhile and
// finishes in the tail: the expirer's metric counts a cycle's purchases as the
// cycle ends), the process's peak RSS during the burst (VmHWM,
// reset at the start through /proc/self/clear_refs), and the shape of the
// record batches the relay wrote (records and bytes a partition batch), so
// that a change to its batching shows. Beside it, on the same number of due
// purchases seeded afresh, it times the raw floor of the expirer's database
// work (rawExpire) and reports the burst's rate as a ratio of it.
// 100,000 purchases, 10,000 under -short, or PROMOFLOW_BURST_EVENTS.
//
// Two shapes of burst: purchases that end at one instant (a campaign that
// ends at midnight: they share one key of the index of Active purchases), and
// purchases whose EndsAt spread over the hour before (a thousand of them an
// instant), as a backlog after an outage leaves them.
func BenchmarkBurst(b *testing.B) {
	withoutSpanRecording(b)
	n := benchEvents(b, "PROMOFLOW_BURST_EVENTS", 100_000, 10_000)
	b.Run("ends=one-instant", func(b *testing.B) { benchBurst(b, n, seedAtOneInstant) })
	b.Run("ends=spread", func(b *testing.B) { benchBurst(b, n, seedSpread) })
}

// seedAtOneInstant seeds n purchases due a minute ago.
func seedAtOneInstant(b *testing.B, db *sqlx.DB, n int) {
	purchasetest.SeedActive(b, db, n, time.Now().Add(-time.Minute))
}

// seedSpread seeds n purchases due over the hour before, a thousand an instant.
func seedSpread(b *testing.B, db *sqlx.DB, n int) {
	const each = 1000
	instants := (n + each - 1) / each
	now := time.Now()
	for i := range instants {
		purchasetest.SeedActive(b, db, min(each, n-i*each), now.Add(-time.Minute-time.Duration(i)*time.Hour/time.Duration(instants)))
	}
}

func benchBurst(b *testing.B, n int, seed func(*testing.B, *sqlx.DB, int)) {
	var totalSecs, expiredSecs, rawSecs, peakMB float64
	var shape batchShape
	for range b.N {
		bundle := promotionBundle{db: pgtest.DB(b), topic: kafkatest.Topic(b, 6)}
		seed(b, bundle.db, n)
		bundle.db.MustExec(`VACUUM ANALYZE promotion.promotion_purchases`)
		resetPeakRSS(b)

		start := time.Now()
		// The process defaults: a tick at once and then every 60s, janitor
		// every 5s, the relay polling an idle outbox every 100ms.
		bundle.startRouter(b, router.PromotionConfig{JanitorInterval: router.OutboxJanitorIntervalDefault,
			OutboxPollInterval: router.OutboxPollIntervalDefault}, expire.Config{Interval: expire.IntervalDefault},
			slog.New(slog.DiscardHandler))
		// Watched through the process's metrics, not the table: a count of the
		// Active rows 50 times a second would load the database the burst
		// runs on (at 1M rows it halved the burst's rate).
		var expiredAt time.Duration
		expired := bundle.metrics.Items.WithLabelValues("expired")
		require.Eventually(b, func() bool {
			if expiredAt == 0 && testutil.ToFloat64(expired) >= float64(n) {
				expiredAt = time.Since(start)
			}
			return expiredAt > 0 && testutil.ToFloat64(bundle.metrics.OutboxRelayed) == float64(n)
		}, 30*time.Minute, 20*time.Millisecond)
		totalSecs += time.Since(start).Seconds()
		var active int
		require.NoError(b, bundle.db.Get(&active, `SELECT count(*) FROM promotion.promotion_purchases WHERE status = 'Active'`))
		require.Zero(b, active, "purchases left Active after the burst")
		expiredSecs += expiredAt.Seconds()
		peakMB = max(peakMB, peakRSSMB(b))
		require.EqualValues(b, n, catalogtest.TopicSize(b, bundle.topic))
		shape = topicBatchShape(b, bundle.topic, n)
		rawSecs += rawExpire(b, n, seed)
	}
	shape.report(b)
	b.Logf("the relay's record batches: %s", shape)
	b.ReportMetric(totalSecs/float64(b.N), "burst-s")
	b.ReportMetric(expiredSecs/float64(b.N), "all-expired-s")
	b.ReportMetric((totalSecs-expiredSecs)/float64(b.N), "relay-tail-s")
	b.ReportMetric(float64(n*b.N)/totalSecs, "events/s")
	b.ReportMetric(float64(n*b.N)/rawSecs, "raw-sql-rows/s")
	b.ReportMetric(rawSecs/totalSecs, "ratio-to-raw-sql")
	b.ReportMetric(peakMB, "peak-rss-MB")
}

// rawExpireStatement is the floor of the expirer's database work for 200
// due purchases, in one statement and one transaction: select them FOR
// UPDATE SKIP LOCKED, expire them, and write an event each into the outbox.
// The outbox takes rows only from a transaction that began with its writer
// lock, so the lock goes first, in the same query string: one implicit
// transaction, one round trip.
const rawExpireStatement = `SELECT promotion.outbox_writer_lock(); WITH due AS (
	SELECT id FROM promotion.promotion_purchases
	WHERE status = 'Active' AND ends_at <= now()
	ORDER BY ends_at LIMIT 200 FOR UPDATE SKIP LOCKED
), expired AS (
	UPDATE promotion.promotion_purchases p SET status = 'Expired', version = p.version + 1, updated_at = now()
	FROM due WHERE p.id = due.id
	RETURNING p.id, p.tenant_id, p.package_kind, p.targets, p.boost_weight, p.status, p.starts_at, p.ends_at, p.version
)
INSERT INTO promotion.outbox_messages (uuid, payload, metadata, transaction_id)
SELECT gen_random_uuid()::text,
	json_build_object('PurchaseId', id, 'TenantId', tenant_id, 'PackageKind', package_kind, 'Targets', targets,
		'BoostWeight', boost_weight, 'Status', status, 'StartsAt', starts_at, 'EndsAt', ends_at, 'Version', version),
	json_build_object('partition_key', id::text), pg_current_xact_id()
FROM expired`

// rawExpire seeds n due purchases on a fresh database and runs
// rawExpireStatement until none is left; it returns the seconds it took.
//
// The statement scans from the oldest EndsAt every time, through the index
// entries of every purchase it expired before, and it does that best on an
// index of (ends_at) alone, whose posting lists hold a burst that ends at one
// instant in a few pages: 4.3 ms a statement over a 1M burst, against 8.0 ms
// on the expirer's (ends_at, id), which the expirer's cursor needs. The floor
// gets its best index.
func rawExpire(b *testing.B, n int, seed func(*testing.B, *sqlx.DB, int)) float64 {
	db := pgtest.DB(b)
	seed(b, db, n)
	db.MustExec(`CREATE INDEX raw_due_idx ON promotion.promotion_purchases (ends_at) WHERE status = 'Active'`)
	db.MustExec(`VACUUM ANALYZE promotion.promotion_purchases`)
	start := time.Now()
	done := 0
	for {
		res, err := db.Exec(rawExpireStatement)
		require.NoError(b, err)
		rows, err := res.RowsAffected()
		require.NoError(b, err)
		if rows == 0 {
			break
		}
		done += int(rows)
	}
	secs := time.Since(start).Seconds()
	require.Equal(b, n, done, "the raw statement expired every due purchase")
	return secs
}

// resetPeakRSS returns the heap's free memory to the OS and sets the
// process's VmHWM back to its current RSS, so that the seeding does not count.
func resetPeakRSS(b *testing.B) {
	debug.FreeOSMemory()
	require.NoError(b, os.WriteFile("/proc/self/clear_refs", []byte("5"), 0))
}

// peakRSSMB is the process's VmHWM in MiB.
func peakRSSMB(b *testing.B) float64 {
	raw, err := os.ReadFile("/proc/self/status")
	require.NoError(b, err)
	return vmHWMMB(b, string(raw))
}

// vmHWMMB is the VmHWM line of a /proc/<pid>/status in MiB.
func vmHWMMB(b *testing.B, status string) float64 {
	mb, ok := parseVmHWM(status)
	if !ok {
		b.Fatalf("no readable VmHWM in the process's status:\n%s", status)
	}
	return mb
}

// parseVmHWM reads the VmHWM line of a /proc/<pid>/status in MiB.
func parseVmHWM(status string) (float64, bool) {
	for line := range strings.Lines(status) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024, err == nil
		}
	}
	return 0, false
}

// watchPeakRSS samples the VmHWM of a running process every 20 ms until
// stop, which returns the last sample in MiB. A child's rusage is no measure
// of its own peak: a child that Go starts shares the parent's memory until it
// execs, and the kernel carries the parent's high-water mark into the child's
// maximum RSS.
func watchPeakRSS(pid int) (stop func() float64) {
	done := make(chan struct{})
	var last float64
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
				if mb, ok := parseVmHWM(string(raw)); ok {
					last = max(last, mb)
				}
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	return func() float64 { close(done); wg.Wait(); return last }
}
