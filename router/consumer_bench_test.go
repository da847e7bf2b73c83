package router_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/lib/pq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// consumerEvents is how many events each side of the benchmark applies:
// 20,000, or 1,000 under -short (CI's pass).
func consumerEvents() int { return benchSize(20_000, 1_000) }

// consumerPartitions are the partition counts measured: 6, 12, 24, 48 and
// 96, or 6 and 48 under -short.
func consumerPartitions() []int {
	if testing.Short() {
		return []int{6, 48}
	}
	return []int{6, 12, 24, 48, 96}
}

// perEventWorkers are the concurrencies the per-event baseline tries, each on
// a quarter of the events; the best of them then applies all the events. One
// worker reached less than half the best in a trial.
var perEventWorkers = []int{2, 4, 8, 16, 32}

// BenchmarkConsumer measures the Promotion Boost consumer end to end (Kafka
// topic of N partitions → chain → group commit → PostgreSQL) against two
// baselines straight to PostgreSQL, each on a database of its own with the
// same cards and events, in the same run:
//
//   - batched: the consumer's transaction without Kafka and middleware. The
//     events in batches of exactly the sizes the consumer formed (recorded
//     from its group commit's OnBatch), each batch one transaction with its
//     dedup keys and boost.Prepared.ApplyBatch, from as many workers as the
//     consumer runs transactions (middleware.GroupCommitWorkersDefault).
//     consumer/batched is the cost of Kafka, the chain and the group commit.
//   - per-event: one transaction per event with its dedup key and
//     boost.Prepared.Apply, at its best concurrency: each of perEventWorkers
//     applies a quarter of the events, and the fastest applies them all.
//     consumer/per-event is what the group commit gains.
//
// Beside the consumer, the same consumer with tracing on (the default
// sampler, spans exported over OTLP/HTTP, each event with a writer's trace
// context in its headers): tracing-on/off is the cost of tracing
// (docs/benchmarks.md); consumer-events/s is the consumer with tracing off.
//
// The order alternates between partition counts (and runs): per-event,
// consumer (off, on), batched; then consumer (on, off), batched, per-event.
// The batched side always follows the consumer whose batch sizes it
// replays, the one with tracing off; a consumer is stopped before any other
// side runs. It reports the events/s of each side, the ratios, the
// per-event side's best concurrency and the consumer's mean events per
// transaction, and checks that every side ends in the same state.
func BenchmarkConsumer(b *testing.B) {
	withoutSpanRecording(b)
	for k, partitions := range consumerPartitions() {
		b.Run(fmt.Sprintf("partitions=%d", partitions), func(b *testing.B) {
			var consumer, traced, batched, perEvent throughput
			var perEventWorkersBest []int
			var cpu, tracedCPU cpuPerEvent
			var peakMB float64
			for i := range b.N {
				var state *consumerBench
				runPerEvent := func() {
					w := bestPerEventWorkers(b)
					perEventWorkersBest = append(perEventWorkersBest, w)
					cb := newConsumerBench(b, w)
					perEvent.add(len(cb.evs), timed(func() { cb.applyPerEvent(b, w, len(cb.evs)) }))
					state = state.same(b, cb)
				}
				if (k+i)%2 == 0 {
					runPerEvent()
				}
				// The consumer with tracing off and on, on databases of their own.
				var sizes []int
				tracingSides(b, k+i, func() struct{} {
					kc := newConsumerBench(b, partitions)
					if tracingIsOn() {
						traceWrites(each(kc.msgs)...)
						kc.consume(b, partitions, &traced, &tracedCPU)
					} else {
						var mb float64
						sizes, mb = kc.consume(b, partitions, &consumer, &cpu)
						peakMB = max(peakMB, mb)
					}
					state = state.same(b, kc)
					return struct{}{}
				})
				b.Logf("events per consumer transaction: mean %.1f over %d transactions (%d partitions)",
					float64(sum(sizes))/float64(len(sizes)), len(sizes), partitions)

				bc := newConsumerBench(b, middleware.GroupCommitWorkersDefault)
				batched.add(len(bc.evs), timed(func() { bc.applyBatched(b, sizes, middleware.GroupCommitWorkersDefault) }))
				state = state.same(b, bc)
				if (k+i)%2 == 1 {
					runPerEvent()
				}
			}
			b.ReportMetric(consumer.rate(), "consumer-events/s")
			b.ReportMetric(batched.rate(), "batched-events/s")
			b.ReportMetric(perEvent.rate(), "per-event-events/s")
			b.ReportMetric(float64(slices.Max(perEventWorkersBest)), "per-event-workers")
			b.ReportMetric(consumer.rate()/batched.rate(), "ratio-vs-batched")
			b.ReportMetric(consumer.rate()/perEvent.rate(), "ratio-vs-per-event")
			b.ReportMetric(peakMB, "peak-rss-MB")
			cpu.report(b, "consumer")
			b.ReportMetric(traced.rate(), "consumer-traced-events/s")
			b.ReportMetric(traced.rate()/consumer.rate(), "tracing-on/off")
			b.ReportMetric(float64(tracedCPU.consumer.Microseconds())/float64(tracedCPU.events), "consumer-traced-cpu-us/event")
		})
	}
}

// each is msgs, one group per message: one writer's transaction per event.
func each(msgs []*message.Message) [][]*message.Message {
	out := make([][]*message.Message, len(msgs))
	for i, m := range msgs {
		out[i] = []*message.Message{m}
	}
	return out
}

type consumerBench struct {
	c    *catalogtest.Bundle
	evs  []event.PurchaseChanged
	msgs []*message.Message
	ids  []uuid.UUID // cards in creation order
	// done, when set, is what consume also waits for before it stops the
	// consumer (BenchmarkConsumerPoison: every dead letter written).
	done func() bool
}

// workload is the targets of one event on a project and one of its objects.
type workload struct {
	name    string
	targets func(project, object uuid.UUID) []event.Target
}

var (
	// cascade events target a project, whose 20 published objects each get
	// the boost, and one of its objects: 21 cards per event.
	cascade = workload{"cascade", func(project, object uuid.UUID) []event.Target {
		return []event.Target{catalogtest.Target(event.TargetProject, project), catalogtest.Target(event.TargetPropertyObject, object)}
	}}
	// simple events target one property object: one card per event.
	simple = workload{"simple", func(_, object uuid.UUID) []event.Target {
		return []event.Target{catalogtest.Target(event.TargetPropertyObject, object)}
	}}
)

// newConsumerBench makes a database with 50 projects of 20 published objects,
// a connection for each of workers, and consumerEvents() cascade events over
// them: each activates a new purchase on a project and one of its objects.
func newConsumerBench(b *testing.B, workers int) *consumerBench {
	return newWorkloadBench(b, workers, consumerEvents(), cascade)
}

// newWorkloadBench is newConsumerBench with n events of workload w.
func newWorkloadBench(b *testing.B, workers, n int, w workload) *consumerBench {
	cb := &consumerBench{c: catalogtest.New(b, true)}
	cb.c.DB.SetMaxOpenConns(workers + 4)
	var objects [][2]uuid.UUID
	for range 50 {
		p := uuid.New()
		cb.c.ProjectCard(b, p)
		cb.ids = append(cb.ids, p)
		for range 20 {
			o := uuid.New()
			cb.c.ObjectCard(b, o, p, true)
			cb.ids = append(cb.ids, o)
			objects = append(objects, [2]uuid.UUID{p, o})
		}
	}
	for i := range n {
		pair := objects[(i*7919)%len(objects)]
		ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 1+i%100, w.targets(pair[0], pair[1])...)
		cb.evs = append(cb.evs, ev)
		msg, err := event.NewMessage(ev, "bench", time.Now())
		require.NoError(b, err)
		cb.msgs = append(cb.msgs, msg)
	}
	return cb
}

// throughput sums the events and seconds of a side's runs.
type throughput struct {
	events int
	secs   float64
}

func (t *throughput) add(events int, secs float64) { t.events, t.secs = t.events+events, t.secs+secs }

func (t throughput) rate() float64 { return float64(t.events) / t.secs }

// consume publishes the events to a topic of partitions partitions, runs the
// catalog router until it consumed them all, stops it, adds to tp the events
// it handled after its first one and the time they took (the consumer-group
// join before the first event is left out: a one-time cost of a start), and
// to cpu the CPU time this process and the database's PostgreSQL backends
// spent meanwhile. It returns the size of every transaction its group commit
// ran, in order, and the process's peak RSS from the router's start (MiB).
func (cb *consumerBench) consume(b *testing.B, partitions int, tp *throughput, cpu *cpuPerEvent) (sizes []int, peakMB float64) {
	cb.c.Cfg.Topic = kafkatest.Topic(b, int32(partitions))
	for i := 0; i < len(cb.msgs); i += 500 {
		require.NoError(b, cb.c.Pub.Publish(cb.c.Cfg.Topic, cb.msgs[i:min(i+500, len(cb.msgs))]...))
	}
	m, err := router.NewCatalogMetrics(prometheus.NewRegistry())
	require.NoError(b, err)
	rec := &sizeRecorder{Histogram: m.BatchSize}
	m.BatchSize = rec // the group commit's OnBatch observes each transaction's size here
	cb.c.Metrics = m
	pg := watchPGBackends(b, cb.c.DB)
	resetPeakRSS(b)
	stop := cb.c.Start(b)
	require.Eventually(b, func() bool { return cb.c.Consumed() > 0 }, time.Minute, time.Millisecond, "the consumer took no event")
	first := cb.c.Consumed()
	selfAt, pgAt := selfCPU(b), pg.CPU()
	secs := timed(func() { cb.c.WaitConsumed(b, float64(len(cb.evs)), 5*time.Minute) })
	if cb.done != nil {
		require.Eventually(b, cb.done, time.Minute, 10*time.Millisecond, "the consumer is done")
	}
	self := selfCPU(b) - selfAt
	pg.close()
	cpu.add(len(cb.evs)-int(first), self, pg.CPU()-pgAt, pg != nil)
	peakMB = peakRSSMB(b)
	stop()
	tp.add(len(cb.evs)-int(first), secs)
	return rec.all(), peakMB
}

// sizeRecorder keeps every value observed, in order, besides the histogram.
type sizeRecorder struct {
	prometheus.Histogram
	mu     sync.Mutex
	values []int
}

func (r *sizeRecorder) Observe(v float64) {
	r.mu.Lock()
	r.values = append(r.values, int(v))
	r.mu.Unlock()
	r.Histogram.Observe(v)
}

func (r *sizeRecorder) all() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.values)
}

// applyBatched is the batched baseline: the events in consecutive batches of
// sizes (repeated if they sum to less), each batch one transaction of its
// dedup keys and ApplyBatch, taken in order by workers goroutines.
func (cb *consumerBench) applyBatched(b *testing.B, sizes []int, workers int) {
	ctx := context.Background()
	applier, err := boost.Prepare(ctx, cb.c.DB)
	require.NoError(b, err)
	defer applier.Close()
	var batches [][2]int // [from, to) of cb.evs
	for from, i := 0, 0; from < len(cb.evs); i++ {
		to := min(from+sizes[i%len(sizes)], len(cb.evs))
		batches = append(batches, [2]int{from, to})
		from = to
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for n := next.Add(1) - 1; n < int64(len(batches)); n = next.Add(1) - 1 {
				if err := cb.commitBatch(ctx, applier, batches[n][0], batches[n][1]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// commitBatch runs the events [from, to) in one transaction, as the group
// commit does: their dedup keys by one statement in key order, then ApplyBatch.
func (cb *consumerBench) commitBatch(ctx context.Context, applier *boost.Prepared, from, to int) error {
	keys := make([]string, 0, to-from)
	for _, msg := range cb.msgs[from:to] {
		keys = append(keys, middleware.DedupKeyPrefixDefault+msg.UUID)
	}
	slices.Sort(keys)
	tx, err := cb.c.DB.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	if _, err := tx.ExecContext(ctx, `INSERT INTO catalog.processed_messages (key)
		SELECT k FROM unnest($1::text[]) AS k ORDER BY k ON CONFLICT (key) DO NOTHING`, pq.Array(keys)); err != nil {
		return err
	}
	if _, err := applier.ApplyBatch(ctx, tx, cb.evs[from:to]); err != nil {
		return err
	}
	return tx.Commit()
}

// bestPerEventWorkers returns the concurrency of perEventWorkers at which
// applyPerEvent applies a quarter of the events fastest, each on a database
// of its own.
func bestPerEventWorkers(b *testing.B) int {
	best, bestRate := 0, 0.0
	for _, w := range perEventWorkers {
		cb := newConsumerBench(b, w)
		n := len(cb.evs) / 4
		rate := float64(n) / timed(func() { cb.applyPerEvent(b, w, n) })
		b.Logf("per-event trial, %d workers: %.0f events/s", w, rate)
		if rate > bestRate {
			best, bestRate = w, rate
		}
	}
	return best
}

// applyPerEvent is the per-event baseline: the same prepared statements, one
// transaction per event with its dedup key, from workers goroutines, for the
// first n events.
func (cb *consumerBench) applyPerEvent(b *testing.B, workers, n int) {
	ctx := context.Background()
	applier, err := boost.Prepare(ctx, cb.c.DB)
	require.NoError(b, err)
	defer applier.Close()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				tx, err := cb.c.DB.BeginTxx(ctx, nil)
				if err == nil {
					_, err = tx.ExecContext(ctx, `INSERT INTO catalog.processed_messages (key) VALUES ($1)`,
						middleware.DedupKeyPrefixDefault+cb.msgs[i].UUID)
				}
				if err == nil {
					_, err = applier.Apply(ctx, tx, cb.evs[i])
				}
				if err == nil {
					err = tx.Commit()
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// same checks that cb's cards end as the reference's (the first side run,
// by card position), and returns the reference.
func (ref *consumerBench) same(b *testing.B, cb *consumerBench) *consumerBench {
	if ref == nil {
		return cb
	}
	require.Equal(b, ref.c.CardBoosts(b), rebased(cb.c.CardBoosts(b), cb.ids, ref.ids), "every side ends in the same state")
	return ref
}

// rebased maps boosts of one bench's cards onto the other's ids by position.
func rebased(boosts map[uuid.UUID]int, from, to []uuid.UUID) map[uuid.UUID]int {
	out := make(map[uuid.UUID]int, len(boosts))
	for i, id := range from {
		out[to[i]] = boosts[id]
	}
	return out
}

func timed(f func()) float64 {
	start := time.Now()
	f()
	return time.Since(start).Seconds()
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}
