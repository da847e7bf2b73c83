package router_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/router/audit"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/router/rebuild"
)

// rebuildEvents is how many purchase events the rebuild's topic holds:
// 1,000,000, or 100,000 under -short (CI's pass).
func rebuildEvents() int { return benchSize(1_000_000, 100_000) }

// rebuildBinaryEnv names a promoflow binary: with it, BenchmarkRebuild runs
// each rebuild as a real `promoflow rebuild` process instead of in its own.
const rebuildBinaryEnv = "PROMOFLOW_BENCH_REBUILD_BIN"

// BenchmarkRebuild measures a projection rebuild from a topic of valid
// purchase events (each Active on a project and one of its published
// objects; 50 projects of 20 objects; 48 compacted partitions, as production
// creates the topic) against a raw COPY of the same rows into a table of the
// staging layout, without Kafka or parsing, in the same run. It reports the
// rebuild's events/s and peak RSS (the process's VmHWM from the rebuild's
// start; with PROMOFLOW_BENCH_REBUILD_BIN, the maximum RSS of the real
// process), each phase's time, the raw COPY's rows/s and the ratio, and the
// p99 and most of the card reads (200/s) that run throughout the rebuild.
// After each rebuild it runs the replica audit (`promoflow audit --replica`:
// the card check and the replica against the topic) and reports its time and
// peak RSS; the audit must find no drift and nothing pending.
//
// Live traffic runs beside it (live): a catalog consumer applies 20 new
// purchases a second while the rebuild runs (their produce → contribution
// times: p50 and most, a stall behind the switch shows in the most), and a
// promotion relay on the same server gets an event a 100 ms throughout (the
// most from commit to topic during the rebuild, during the audit, and
// between them). In this process's figures the peak RSS counts them too:
// PROMOFLOW_BENCH_REBUILD_BIN gives the rebuild's own.
func BenchmarkRebuild(b *testing.B) {
	rb := newRebuildBench(b)
	rb.live = rb.startLive(b)
	var applied []time.Duration
	var took, copySecs, auditSecs time.Duration
	var peakMB, auditMB float64
	var reads []time.Duration
	phases := map[string]float64{}
	for range b.N {
		copySecs += rb.rawCopy(b)
		stopReads := rb.readCards(b)
		stopLive := rb.live.during(b, "rebuild", true)
		t, mb, ph := rb.rebuild(b)
		reads = append(reads, stopReads()...)
		applied = append(applied, stopLive()...)
		took += t
		peakMB = max(peakMB, mb)
		for k, v := range ph {
			phases[k] += v
		}
		rb.check(b)
		stopLive = rb.live.during(b, "audit", false)
		t, mb = rb.audit(b)
		stopLive()
		auditSecs += t
		auditMB = max(auditMB, mb)
	}
	n := float64(rb.events * b.N)
	rate, copyRate := n/took.Seconds(), n/copySecs.Seconds()
	b.ReportMetric(rate, "events/s")
	b.ReportMetric(peakMB, "peak-rss-MB")
	b.ReportMetric(copyRate, "raw-copy-rows/s")
	b.ReportMetric(rate/copyRate, "ratio-vs-raw-copy")
	for _, p := range []rebuild.Phase{rebuild.PhaseRead, rebuild.PhaseLoad, rebuild.PhaseCompute, rebuild.PhaseCatchUp, rebuild.PhaseSwitch} {
		b.ReportMetric(phases[string(p)]/float64(b.N), string(p)+"-ms")
	}
	slices.Sort(reads)
	if len(reads) > 0 {
		b.ReportMetric(float64(reads[len(reads)*99/100].Microseconds())/1000, "card-read-p99-ms")
		b.ReportMetric(float64(reads[len(reads)-1].Microseconds())/1000, "card-read-max-ms")
	}
	b.ReportMetric(float64(len(reads)), "card-reads")
	b.ReportMetric(auditSecs.Seconds()/float64(b.N), "audit-replica-s")
	b.ReportMetric(auditMB, "audit-peak-rss-MB")
	if len(applied) > 0 {
		b.ReportMetric(float64(percentile(applied, 0.5).Microseconds())/1000, "live-apply-p50-ms")
		b.ReportMetric(float64(slices.Max(applied).Microseconds())/1000, "live-apply-max-ms")
	}
	for phase, d := range rb.live.relay.LongestDelays(b) {
		b.ReportMetric(float64(d.Microseconds())/1000, "relay-"+phase+"-max-ms")
	}
}

type rebuildBench struct {
	c      *catalogtest.Bundle
	events int
	bulk   *catalogtest.Bulk
	live   *live
}

// newRebuildBench makes the cards and fills the topic with pre-encoded
// records, sent in batches.
func newRebuildBench(b *testing.B) *rebuildBench {
	rb := &rebuildBench{c: catalogtest.New(b, true), events: rebuildEvents()}
	rb.c.Cfg.Topic = kafkatest.TopicWith(b, kafkakit.Topic{Partitions: 48, CleanupPolicy: kafkakit.PolicyCompact})
	rb.bulk = catalogtest.NewBulk(b, rb.c)
	rb.bulk.Produce(b, rb.c.Cfg.Topic, rb.events)
	return rb
}

// rawCopy copies rows of the staging layout, one per event, straight into
// an unlogged table, and returns the time it took.
func (rb *rebuildBench) rawCopy(b *testing.B) time.Duration {
	ctx := context.Background()
	_, err := rb.c.DB.Exec(`DROP TABLE IF EXISTS bench_copy; CREATE UNLOGGED TABLE bench_copy (purchase_id uuid NOT NULL,
		version bigint NOT NULL, status text NOT NULL, boost_weight integer NOT NULL, ends_at timestamptz NOT NULL,
		target_kinds text[] NOT NULL, target_ids uuid[] NOT NULL, part integer NOT NULL, off bigint NOT NULL)`)
	require.NoError(b, err)
	start := time.Now()
	tx, err := rb.c.DB.BeginTxx(ctx, nil)
	require.NoError(b, err)
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	stmt, err := tx.Prepare(pq.CopyIn("bench_copy", "purchase_id", "version", "status", "boost_weight", "ends_at",
		"target_kinds", "target_ids", "part", "off"))
	require.NoError(b, err)
	for i := range rb.events {
		ev := rb.bulk.Event(i)
		_, err := stmt.Exec(ev.PurchaseId.String(), ev.Version, string(ev.Status), ev.BoostWeight,
			ev.EndsAt.Format(time.RFC3339Nano), "{Project,PropertyObject}",
			"{"+ev.Targets[0].TargetId.String()+","+ev.Targets[1].TargetId.String()+"}", i%48, i)
		require.NoError(b, err)
	}
	_, err = stmt.Exec()
	require.NoError(b, err)
	require.NoError(b, stmt.Close())
	require.NoError(b, tx.Commit())
	took := time.Since(start)
	_, err = rb.c.DB.Exec(`DROP TABLE bench_copy`)
	require.NoError(b, err)
	return took
}

// readCards reads a card every 5 ms, as a storefront would, until the
// returned stop, which returns each read's latency.
func (rb *rebuildBench) readCards(b *testing.B) (stop func() []time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	var lat []time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			pair := rb.bulk.Pairs[i%len(rb.bulk.Pairs)]
			start := time.Now()
			var err error
			if i%2 == 0 {
				_, err = boost.GetProjectCard(ctx, rb.c.DB, pair[0])
			} else {
				_, err = boost.GetPropertyObjectCard(ctx, rb.c.DB, pair[1])
			}
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				b.Errorf("card read during the rebuild: %v", err)
				return
			}
			lat = append(lat, time.Since(start))
		}
	})
	return func() []time.Duration { cancel(); wg.Wait(); return lat }
}

// rebuild runs one rebuild, in this process or as a promoflow process, and
// returns its time, its peak RSS in MiB and each phase's milliseconds.
func (rb *rebuildBench) rebuild(b *testing.B) (time.Duration, float64, map[string]float64) {
	if bin := os.Getenv(rebuildBinaryEnv); bin != "" {
		return rb.rebuildProcess(b, bin)
	}
	pr, pw := io.Pipe()
	phases := collectPhases(pr)
	r, err := rebuild.New(rebuild.Config{DB: rb.c.DB, Kafka: rb.c.Cfg.Kafka, Topic: rb.c.Cfg.Topic,
		Log: slog.New(slog.NewJSONHandler(pw, nil))})
	require.NoError(b, err)
	resetPeakRSS(b)
	start := time.Now()
	st, err := r.Run(context.Background())
	took := time.Since(start)
	peak := peakRSSMB(b)
	require.NoError(b, err)
	require.Equal(b, rebuild.StateDone, st.State)
	require.NoError(b, pw.Close())
	return took, peak, <-phases
}

// rebuildProcess runs `bin rebuild` on the bench's database and topic.
func (rb *rebuildBench) rebuildProcess(b *testing.B, bin string) (time.Duration, float64, map[string]float64) {
	cmd := exec.Command(bin, "rebuild")
	cmd.Env = rb.processEnv()
	stderr, err := cmd.StderrPipe()
	require.NoError(b, err)
	phases := collectPhases(stderr)
	start := time.Now()
	require.NoError(b, cmd.Start())
	peak := watchPeakRSS(cmd.Process.Pid)
	ph := <-phases
	err = cmd.Wait()
	took, mb := time.Since(start), peak()
	require.NoError(b, err, "promoflow rebuild")
	b.Logf("promoflow rebuild: %s, peak RSS %.1f MB (%s)", took.Round(time.Millisecond), mb, bin)
	return took, mb, ph
}

// processEnv points a promoflow process at the bench's database and topic.
func (rb *rebuildBench) processEnv() []string {
	return append(os.Environ(), "DATABASE_URL="+rb.c.URL, "KAFKA_BROKERS="+strings.Join(rb.c.Cfg.Kafka.Brokers, ","),
		"PROMOTION_TOPIC="+rb.c.Cfg.Topic, "CATALOG_CONSUMER_GROUP="+rb.c.Cfg.ConsumerGroup, "MIGRATE_ON_START=false")
}

// collectPhases reads a rebuild's JSON log until it ends and sends each
// phase's milliseconds.
func collectPhases(r io.Reader) <-chan map[string]float64 {
	out := make(chan map[string]float64, 1)
	go func() {
		phases := map[string]float64{}
		s := bufio.NewScanner(r)
		s.Buffer(make([]byte, 1<<20), 1<<20)
		for s.Scan() {
			var rec struct {
				Msg    string  `json:"msg"`
				Phase  string  `json:"phase"`
				TookMs float64 `json:"tookMs"`
			}
			if json.Unmarshal(s.Bytes(), &rec) == nil && rec.Msg == "rebuild phase done" {
				phases[rec.Phase] = rec.TookMs
			}
		}
		out <- phases
	}()
	return out
}

// check compares the rebuilt cards with the formula over the events: every
// published object of a project gets its project's sum, and its own.
func (rb *rebuildBench) check(b *testing.B) {
	want := map[uuid.UUID]int{}
	own := map[uuid.UUID]int{}
	for i := range rb.events {
		pair := rb.bulk.Pair(i)
		want[pair[0]] += 1 + i%100
		own[pair[1]] += 1 + i%100
	}
	for _, pair := range rb.bulk.Pairs {
		want[pair[1]] = want[pair[0]] + own[pair[1]]
	}
	rb.live.want(want)
	got := map[uuid.UUID]int{}
	rows, err := rb.c.DB.Queryx(`SELECT id, promotion_boost FROM catalog.project_cards
		UNION ALL SELECT id, promotion_boost FROM catalog.property_object_cards`)
	require.NoError(b, err)
	defer rows.Close()
	for rows.Next() {
		var id uuid.UUID
		var boost int
		require.NoError(b, rows.Scan(&id, &boost))
		got[id] = boost
	}
	require.NoError(b, rows.Err())
	require.Equal(b, want, got, "the rebuilt boosts")
	var n int
	require.NoError(b, sqlx.Get(rb.c.DB, &n, `SELECT count(*) FROM catalog.promotion_contributions`))
	require.Equal(b, 2*rb.events+rb.live.sent, n, fmt.Sprintf("one contribution per purchase and target, %d purchases and %d new",
		rb.events, rb.live.sent))
}

// audit runs the card check and the replica check, in this process or as a
// promoflow process, requires that they find every purchase and no drift or
// pending record, and returns their time and peak RSS in MiB.
func (rb *rebuildBench) audit(b *testing.B) (time.Duration, float64) {
	var rep struct {
		Cards   audit.CardsReport    `json:"cards"`
		Replica *audit.ReplicaReport `json:"replica"`
	}
	var took time.Duration
	var peak float64
	if bin := os.Getenv(rebuildBinaryEnv); bin != "" {
		cmd := exec.Command(bin, "audit", "--replica", "--json")
		cmd.Env = rb.processEnv()
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		start := time.Now()
		require.NoError(b, cmd.Start())
		stop := watchPeakRSS(cmd.Process.Pid)
		err := cmd.Wait()
		took, peak = time.Since(start), stop()
		require.NoError(b, err, "promoflow audit --replica: %s", stderr.String())
		require.NoError(b, json.Unmarshal(out.Bytes(), &rep), "promoflow audit --replica --json: %s", out.String())
	} else {
		a, err := audit.New(audit.Config{DB: rb.c.DB, Kafka: rb.c.Cfg.Kafka, Topic: rb.c.Cfg.Topic,
			ConsumerGroup: rb.c.Cfg.ConsumerGroup})
		require.NoError(b, err)
		resetPeakRSS(b)
		start := time.Now()
		rep.Cards, err = a.Cards(context.Background())
		require.NoError(b, err)
		r, err := a.Replica(context.Background())
		require.NoError(b, err)
		took, peak, rep.Replica = time.Since(start), peakRSSMB(b), &r
	}
	require.Zero(b, rep.Cards.Drifted, "the audit's drifted cards")
	require.NotNil(b, rep.Replica)
	require.Equal(b, int64(rb.events+rb.live.sent), rep.Replica.Purchases, "the audit's purchases")
	require.Zero(b, rep.Replica.Drifted, "the audit's drifted purchases")
	require.Zero(b, rep.Replica.Pending, "the audit's pending purchases")
	b.Logf("audit --replica: %s, peak RSS %.1f MB, %d cards, %d purchases", took.Round(time.Millisecond), peak,
		rep.Cards.Checked, rep.Replica.Purchases)
	return took, peak
}
