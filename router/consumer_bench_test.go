package router_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
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

// BenchmarkConsumer measures the Promotion Boost consumer end to end (Kafka
// topic → chain → group commit → PostgreSQL) against a raw baseline of the
// one-statement delta design straight to PostgreSQL: per event one
// transaction with its dedup key and boost.Apply's prepared statements (lock,
// card row locks, one statement for contributions and card deltas). The
// consumer reads a topic of N partitions and the baseline runs N workers;
// each reports events/s of both sides and their ratio (target >= 0.8), and
// logs the consumer's mean events per transaction.
func BenchmarkConsumer(b *testing.B) {
	withoutSpanRecording(b)
	for _, partitions := range consumerPartitions() {
		b.Run(fmt.Sprintf("partitions=%d", partitions), func(b *testing.B) {
			var rawSecs, consumerSecs float64
			for range b.N {
				raw := newConsumerBench(b, partitions)
				start := time.Now()
				raw.applyRaw(b, partitions)
				rawSecs += time.Since(start).Seconds()

				kc := newConsumerBench(b, partitions)
				kc.c.Cfg.Topic = kafkatest.Topic(b, int32(partitions))
				for i := 0; i < len(kc.msgs); i += 500 {
					require.NoError(b, kc.c.Pub.Publish(kc.c.Cfg.Topic, kc.msgs[i:min(i+500, len(kc.msgs))]...))
				}
				start = time.Now()
				kc.c.Start(b)
				kc.c.WaitConsumed(b, float64(consumerEvents()), 5*time.Minute)
				consumerSecs += time.Since(start).Seconds()
				b.Logf("events per consumer transaction: %s", histogramMean(b, kc.c.Metrics.BatchSize))
				require.Equal(b, raw.c.CardBoosts(b), rebased(kc.c.CardBoosts(b), kc.ids, raw.ids), "both sides end in the same state")
			}
			rawRate := float64(consumerEvents()*b.N) / rawSecs
			consumerRate := float64(consumerEvents()*b.N) / consumerSecs
			b.ReportMetric(rawRate, "raw-events/s")
			b.ReportMetric(consumerRate, "consumer-events/s")
			b.ReportMetric(consumerRate/rawRate, "ratio")
		})
	}
}

type consumerBench struct {
	c    *catalogtest.Bundle
	evs  []event.PurchaseChanged
	msgs []*message.Message
	ids  []uuid.UUID // cards in creation order
}

// newConsumerBench makes a database with 50 projects of 20 published objects,
// a connection for each of workers, and events over them: each activates a
// new purchase on a project and one of its objects.
func newConsumerBench(b *testing.B, workers int) *consumerBench {
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
	for i := range consumerEvents() {
		pair := objects[(i*7919)%len(objects)]
		ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 1+i%100, catalogtest.Target(event.TargetProject, pair[0]), catalogtest.Target(event.TargetPropertyObject, pair[1]))
		cb.evs = append(cb.evs, ev)
		msg, err := event.NewMessage(ev, "bench", time.Now())
		require.NoError(b, err)
		cb.msgs = append(cb.msgs, msg)
	}
	return cb
}

// applyRaw is the baseline: the same statements (prepared, as the consumer
// runs them) with no Kafka and no middleware, one transaction per event, from
// workers goroutines.
func (cb *consumerBench) applyRaw(b *testing.B, workers int) {
	ctx := context.Background()
	applier, err := boost.Prepare(ctx, cb.c.DB)
	require.NoError(b, err)
	defer applier.Close()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(cb.evs); i += workers {
				tx, err := cb.c.DB.BeginTxx(ctx, nil)
				if err == nil {
					_, err = tx.ExecContext(ctx, `INSERT INTO catalog.processed_messages (key) VALUES ($1)`,
						"catalog-promotion:purchase-changed:"+cb.msgs[i].UUID)
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
		}()
	}
	wg.Wait()
}

// rebased maps boosts of one bench's cards onto the other's ids by position.
func rebased(boosts map[uuid.UUID]int, from, to []uuid.UUID) map[uuid.UUID]int {
	out := make(map[uuid.UUID]int, len(boosts))
	for i, id := range from {
		out[to[i]] = boosts[id]
	}
	return out
}

func histogramMean(b *testing.B, h prometheus.Histogram) string {
	var m dto.Metric
	require.NoError(b, h.Write(&m))
	return fmt.Sprintf("mean %.1f over %d transactions", m.Histogram.GetSampleSum()/float64(m.Histogram.GetSampleCount()), m.Histogram.GetSampleCount())
}
