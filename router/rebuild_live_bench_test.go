package router_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// liveRate is how many new purchases a second the live traffic of
// BenchmarkRebuild sends while a rebuild runs, each on the live project.
const liveRate = 20

// live is BenchmarkRebuild's traffic beside the rebuild: a catalog consumer
// on the rebuild's topic that applies new purchases (each Active on a
// project card of its own, whose one published object its boost cascades
// to) as they come, and a promotion relay on the same server that gets an
// event into its outbox every 100 ms. What it measures: how long each new
// purchase took from its produce to its contribution in the live replica
// (a stall of the consumer, behind the rebuild's switch say, shows there),
// and how long each promotion event took from its commit to the topic, per
// phase.
type live struct {
	rb              *rebuildBench
	project, object uuid.UUID
	relay           *catalogtest.Relay
	phase           atomic.Value // string: the label of events sent now

	sent int // new purchases produced so far, over every run
}

// startLive makes the live cards, moves the consumer group to the topic's
// end (the bench's records are the rebuild's to load, not the consumer's to
// catch up on) and starts the consumer and the relay.
func (rb *rebuildBench) startLive(b *testing.B) *live {
	l := &live{rb: rb, project: uuid.New(), object: uuid.New()}
	_, err := rb.c.DB.Exec(`INSERT INTO catalog.project_cards (id, status, visibility) VALUES ($1, 'Published', 'Visible')`, l.project)
	require.NoError(b, err)
	_, err = rb.c.DB.Exec(`INSERT INTO catalog.property_object_cards (id, project_id, published, status)
		VALUES ($1, $2, true, 'OnSale')`, l.object, l.project)
	require.NoError(b, err)
	commitEnds(b, rb.c.Cfg.ConsumerGroup, rb.c.Cfg.Topic)
	rb.c.Start(b)
	l.phase.Store("idle")
	l.relay = catalogtest.StartRelay(b, rb.c.DB)
	stop := l.relay.SendEvery(b, 100*time.Millisecond, func() string { return l.phase.Load().(string) })
	b.Cleanup(stop)
	return l
}

// commitEnds commits group's offsets at topic's end offsets.
func commitEnds(b *testing.B, group, topic string) {
	client, err := sarama.NewClient(kafkatest.Brokers(b), kafkatest.Cluster(b).ClientConfig("promoflow-bench"))
	require.NoError(b, err)
	defer client.Close()
	om, err := sarama.NewOffsetManagerFromClient(group, client)
	require.NoError(b, err)
	defer om.Close()
	for p, end := range catalogtest.PartitionSizes(b, topic) {
		pom, err := om.ManagePartition(topic, p)
		require.NoError(b, err)
		pom.MarkOffset(end, "")
		require.NoError(b, pom.Close())
	}
	om.Commit()
}

// during labels the relay's events phase, and sends new purchases at
// liveRate until the returned stop, which waits until each is in the live
// replica and returns how long each took from its produce.
func (l *live) during(b *testing.B, phase string, purchases bool) (stop func() []time.Duration) {
	l.phase.Store(phase)
	if !purchases {
		return func() []time.Duration { l.phase.Store("idle"); return nil }
	}
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	produced := map[uuid.UUID]time.Time{}
	applied := map[uuid.UUID]time.Time{}
	var wg sync.WaitGroup
	wg.Go(func() {
		every(ctx, time.Second/liveRate, func() {
			ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 1, catalogtest.Target(event.TargetProject, l.project))
			at := time.Now()
			l.rb.c.Produce(b, ev)
			mu.Lock()
			produced[ev.PurchaseId] = at
			mu.Unlock()
		})
	})
	poll := func() {
		mu.Lock()
		var pending []string
		for id := range produced {
			if _, ok := applied[id]; !ok {
				pending = append(pending, id.String())
			}
		}
		mu.Unlock()
		var done []uuid.UUID
		require.NoError(b, l.rb.c.DB.Select(&done, `SELECT purchase_id FROM catalog.promotion_contributions
			WHERE purchase_id = ANY($1::uuid[])`, pq.Array(pending)))
		now := time.Now()
		mu.Lock()
		for _, id := range done {
			applied[id] = now
		}
		mu.Unlock()
	}
	wg.Go(func() { every(ctx, 10*time.Millisecond, poll) })
	return func() []time.Duration {
		cancel()
		wg.Wait()
		l.phase.Store("idle")
		require.Eventually(b, func() bool { poll(); return len(applied) == len(produced) }, time.Minute, 10*time.Millisecond,
			"every new purchase is applied after the rebuild")
		l.sent += len(produced)
		out := make([]time.Duration, 0, len(produced))
		for id, at := range produced {
			out = append(out, applied[id].Sub(at))
		}
		return out
	}
}

// want adds the live cards' boosts to want: every new purchase weighs 1.
func (l *live) want(want map[uuid.UUID]int) {
	want[l.project], want[l.object] = l.sent, l.sent
}

// every runs do every period until ctx ends.
func every(ctx context.Context, period time.Duration, do func()) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			do()
		}
	}
}
