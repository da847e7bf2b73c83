//go:build faults

package faults

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/promoflow/promoflow/handlers/outbox"
)

// relayStallBound is how long the relay may stand still when its holder
// loses Kafka: the other promotion process must have taken the position over.
const relayStallBound = 30 * time.Second

// positionWatch samples the relay's outbox position (the offsets row the
// holder locks; a plain read does not wait for that lock) every 100ms and
// keeps when it moved.
type positionWatch struct {
	e    *env
	stop chan struct{}
	wg   sync.WaitGroup

	mu    sync.Mutex
	moves []time.Time
	err   error
}

func (e *env) watchPosition() *positionWatch {
	w := &positionWatch{e: e, stop: make(chan struct{})}
	w.wg.Go(func() {
		var last int64 = -1
		for {
			var at int64
			err := e.db.Get(&at, `SELECT offset_acked FROM `+outbox.OffsetsTable+` WHERE consumer_group = $1`,
				outbox.RelayConsumerGroup)
			w.mu.Lock()
			switch {
			case err != nil:
				w.err = err
			case at != last:
				w.moves = append(w.moves, time.Now())
				last = at
			}
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	return w
}

// stalls are the times within [from, to] that the position stood still
// for over a second, in order (the last one may end at to), and how long
// after from it first moved (to-from if it never did).
func (w *positionWatch) stalls(from, to time.Time) (stalls []time.Duration, first time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	prev := from
	first = to.Sub(from)
	for _, at := range append(w.moves, to) {
		if at.Before(from) || at.After(to) {
			continue
		}
		if prev == from && at != to {
			first = at.Sub(from)
		}
		if gap := at.Sub(prev); gap > time.Second {
			stalls = append(stalls, gap.Round(100*time.Millisecond))
		}
		prev = at
	}
	return stalls, first
}

func (w *positionWatch) close() error {
	close(w.stop)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// cutRelayHolder (f): under traffic, promotion-1, whose Kafka traffic goes
// through the proxies, loses Kafka (a black hole: connections stay open,
// nothing answers) while its session holds the relay's transaction, and its
// database stays healthy. For cutFor the relay's outbox position must never
// stand still longer than relayStallBound: promotion-2 takes the position
// over and keeps relaying; PromotionRelayCutOffFromKafka fires. After the
// heal promotion-1 relays again, the alert resolves, and the checker finds
// nothing lost or reordered.
func cutRelayHolder(t *testing.T, e *env) int {
	cutFor := time.Duration(size(60, 90)) * time.Second
	cut, other := e.promotions[0], e.promotions[1]
	tr := e.drive(150, 0.2)
	tr.waitCreated(100, 30*time.Second, "before the cut")
	watch := e.watchPosition()
	if _, ok := eventually(e.ctx, 30*time.Second, func() bool {
		seen, err := e.inside([]*proc{cut}, relaySQL)
		return err == nil && len(seen) > 0
	}); !ok {
		e.violate("%s was never seen inside the relay's transaction", cut.name)
	}
	e.cutKafka()
	e.fault()
	from := time.Now()
	otherBefore, err := metric(other, "promotion_outbox_relayed_total")
	if err != nil {
		e.violate("%v", err)
	}
	e.expectAlert("PromotionRelayCutOffFromKafka", true, cutFor)
	time.Sleep(time.Until(from.Add(cutFor))) // the length of the partition, not a synchronisation
	stalls, first := watch.stalls(from, time.Now())
	longest := slices.Max(append(stalls, 0))
	otherAfter, err := metric(other, "promotion_outbox_relayed_total")
	if err != nil {
		e.violate("%v", err)
	}
	cutBefore, err := metric(cut, "promotion_outbox_relayed_total")
	if err != nil {
		e.violate("%v", err)
	}
	e.healKafka()
	var back time.Duration
	if took, ok := eventually(e.ctx, 90*time.Second, func() bool {
		now, err := metric(cut, "promotion_outbox_relayed_total")
		return err == nil && now > cutBefore
	}); !ok {
		e.violate("%s did not relay again within 90s of the heal", cut.name)
	} else {
		back = took
	}
	e.expectAlert("PromotionRelayCutOffFromKafka", false, time.Minute)
	if err := watch.close(); err != nil {
		e.violate("outbox position: %v", err)
	}
	if longest > relayStallBound {
		e.violate("the relay stood still for %s while %s was cut off from Kafka (bound %s)", longest.Round(100*time.Millisecond),
			cut.name, relayStallBound)
	}
	if otherAfter <= otherBefore {
		e.violate("%s relayed nothing while %s was cut off (%v, then %v)", other.name, cut.name, otherBefore, otherAfter)
	}
	e.setDetail("cut for %s: the relay's position first moved %s after the cut and stood still %s at most (stalls over 1s: %v); %s relayed %v events meanwhile; %s relayed again %s after the heal",
		cutFor, first.Round(100*time.Millisecond), longest, stalls, other.name, otherAfter-otherBefore,
		cut.name, back.Round(100*time.Millisecond))
	return tr.end(t)
}

// catalogCutFromPostgres (g): under load catalog-1, whose PostgreSQL
// traffic goes through the proxy, loses its database (a black hole) while
// it keeps Kafka: its partitions stall, its lag passes the
// SLO and CatalogPromotionLagHigh fires, while catalog-2 goes on consuming.
// The database comes back: the alert resolves, and the checker finds
// nothing lost.
func catalogCutFromPostgres(t *testing.T, e *env) int {
	cut, other := e.catalogs[0], e.catalogs[1]
	tr := e.drive(100, 0.2)
	tr.waitCreated(100, 30*time.Second, "before the cut")
	consumed, err := metric(other, "catalog_promotion_consumed_total")
	must(t, err)
	e.pgProxy.BlackHole()
	e.fault()
	e.expectAlert("CatalogPromotionLagHigh", true, 3*time.Minute)
	lag, err := metric(cut, "catalog_promotion_lag_seconds")
	if err != nil || lag < 60 {
		e.violate("%s reports a lag of %v s while cut off from PostgreSQL, want over 60 (%v)", cut.name, lag, err)
	}
	if now, err := metric(other, "catalog_promotion_consumed_total"); err != nil || now <= consumed {
		e.violate("%s consumed nothing while %s was cut off (%v, then %v: %v)", other.name, cut.name, consumed, now, err)
	}
	e.pgProxy.Heal()
	healed := time.Now()
	e.expectAlert("CatalogPromotionLagHigh", false, 3*time.Minute)
	resolved := time.Since(healed)
	e.setDetail("%s cut off from PostgreSQL until the lag alert fired (its lag %.0fs); the alert resolved %s after the heal",
		cut.name, lag, resolved.Round(time.Second))
	return tr.end(t)
}

// latencyWindow is how long every Kafka connection runs with added latency.
const latencyWindow = 60 * time.Second

// kafkaLatency (h): every process's Kafka traffic goes through the proxies;
// under load every connection gets 200 ms more latency (from the brokers to
// the processes) for 60 s. Correctness holds (the checker), and the
// consumer group does not rebalance over and over: at most two sessions
// start (catalog_promotion_group_sessions_total) over both catalog
// processes while the latency lasts. The line gives the events relayed and
// consumed a second before and during the window.
func kafkaLatency(t *testing.T, e *env) int {
	tr := e.drive(100, 0.2)
	tr.waitCreated(100, 30*time.Second, "before the latency")
	rate := func(window time.Duration) (relayed, consumed float64) {
		r0, c0 := e.relayedTotal(), e.consumedTotal()
		time.Sleep(window) // a measuring window, not a synchronisation
		return (e.relayedTotal() - r0) / window.Seconds(), (e.consumedTotal() - c0) / window.Seconds()
	}
	relayedBefore, consumedBefore := rate(20 * time.Second)
	sessions, err := sumMetric(e.catalogs, "catalog_promotion_group_sessions_total")
	must(t, err)
	for _, p := range e.kafkaProxies {
		p.SetLatency(200 * time.Millisecond)
	}
	e.fault()
	relayedDuring, consumedDuring := rate(latencyWindow)
	after, err := sumMetric(e.catalogs, "catalog_promotion_group_sessions_total")
	must(t, err)
	for _, p := range e.kafkaProxies {
		p.SetLatency(0)
	}
	if relayedDuring <= 0 || consumedDuring <= 0 {
		e.violate("events stopped while every Kafka connection had 200 ms more latency: %.0f relayed/s, %.0f consumed/s", relayedDuring, consumedDuring)
	}
	if rebalances := after - sessions; rebalances > 2 {
		e.violate("%v consumer-group sessions started while every Kafka connection had 200 ms more latency: a rebalance storm", rebalances)
	}
	e.setDetail("events/s relayed %.0f, consumed %.0f before; %.0f and %.0f with 200ms on every Kafka connection for %s; %v consumer-group sessions started meanwhile",
		relayedBefore, consumedBefore, relayedDuring, consumedDuring, latencyWindow, after-sessions)
	return tr.end(t)
}

// consumedTotal sums catalog_promotion_consumed_total over the running
// catalog processes.
func (e *env) consumedTotal() float64 {
	var sum float64
	for _, p := range e.catalogs {
		if v, err := metric(p, "catalog_promotion_consumed_total"); err == nil && p.alive() {
			sum += v
		}
	}
	return sum
}
