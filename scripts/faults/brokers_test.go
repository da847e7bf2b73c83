//go:build faults

package faults

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// stallLine says how long the relay's position stood still within [from, to].
func stallLine(w *positionWatch, from, to time.Time) string {
	stalls, _ := w.stalls(from, to)
	return fmt.Sprintf("the relay stood still %s at most", slices.Max(append(stalls, 0)))
}

// killLeader (a): under load, the broker that leads most partitions of the
// purchase topic (three replicas, min.insync.replicas 2) is killed with -9.
// Every partition gets a leader on a live broker and an ISR of 2 within a
// minute, the relay publishes again and the API keeps creating; the broker
// is started again and every ISR is 3 within 2 minutes.
func killLeader(t *testing.T, e *env) int {
	e.checkReplication()
	tr := e.drive(150, 0.2)
	tr.waitCreated(100, 30*time.Second, "before the kill")
	watch := e.watchPosition()
	victim, led, err := e.s.leaderOfMost(e.topic)
	must(t, err)
	killedAt := time.Now()
	e.s.nodes(t, "kill", victim)
	e.fault()
	// Counted once the kill is done, so that only a publish after it counts.
	relayed := e.relayedTotal()
	elected := e.waitISR(2, time.Minute, victim)
	resumed := e.waitRelayed(relayed, time.Minute, "after the leader was killed")
	tr.waitCreated(100, 30*time.Second, "after the leader was killed")
	upAt := time.Now()
	e.s.nodes(t, "up", victim)
	rejoined := e.waitISR(3, 2*time.Minute)
	e.setDetail("broker %d led %d partitions; after its kill -9 every partition had a live leader and ISR 2 in %s, the relay published again in %s; %s; ISR 3 again %s after its restart",
		victim, led, elected.Round(100*time.Millisecond), resumed.Round(100*time.Millisecond), stallLine(watch, killedAt, upAt),
		rejoined.Round(100*time.Millisecond))
	watch.close()
	return tr.end(t)
}

// brokerDown (b): under load one broker stops for 60 s: every partition
// keeps a leader with an ISR of 2, and writes go on (the relay's position
// never stands still for relayStallBound); it starts again and every ISR
// is 3 within 2 minutes.
func brokerDown(t *testing.T, e *env) int {
	tr := e.drive(150, 0.2)
	tr.waitCreated(100, 30*time.Second, "before the stop")
	watch := e.watchPosition()
	const victim = 2
	downAt := time.Now()
	e.s.nodes(t, "down", victim)
	e.fault()
	shrunk := e.waitISR(2, time.Minute, victim)
	relayed := e.relayedTotal()
	time.Sleep(time.Until(downAt.Add(time.Minute))) // the length of the outage, not a synchronisation
	if e.relayedTotal() <= relayed {
		e.violate("nothing was relayed while broker %d was down with ISR 2 of 3", victim)
	}
	upAt := time.Now()
	stalls, _ := watch.stalls(downAt, upAt)
	if longest := slices.Max(append(stalls, 0)); longest > relayStallBound {
		e.violate("the relay stood still for %s while one broker of three was down", longest)
	}
	e.s.nodes(t, "up", victim)
	rejoined := e.waitISR(3, 2*time.Minute)
	e.setDetail("broker %d down for 1m: ISR 2 in %s; %s; ISR 3 again %s after its start", victim, shrunk.Round(100*time.Millisecond),
		stallLine(watch, downAt, upAt), rejoined.Round(100*time.Millisecond))
	watch.close()
	return tr.end(t)
}

// notEnoughReplicas is how Sarama words Kafka's NOT_ENOUGH_REPLICAS.
var notEnoughReplicas = sarama.ErrNotEnoughReplicas.Error()

// twoBrokersDown (c): under load two brokers of three stop for 30 s. Every
// ISR shrinks to the last broker, below min.insync.replicas, and Kafka
// refuses the relay's writes with NOT_ENOUGH_REPLICAS: the relay steps back
// (a process's log says so), the API keeps creating into the outbox,
// PromotionOutboxBacklogHigh fires. One broker starts again: the relay
// publishes again by itself and, once the backlog drained, the alert
// resolves (within 5 minutes); then the other starts.
// The checker finds nothing lost or reordered.
func twoBrokersDown(t *testing.T, e *env) int {
	tr := e.drive(100, 0.2)
	tr.waitCreated(100, 30*time.Second, "before the stop")
	stepBacks, err := sumMetric(e.promotions, "promotion_outbox_relay_step_backs_total")
	must(t, err)
	downAt := time.Now()
	e.s.nodes(t, "down", 2, 3)
	e.fault()
	e.waitISR(1, time.Minute, 2, 3)
	tr.waitCreated(50, 30*time.Second, "while two brokers were down")
	var refused bool
	if _, ok := eventually(e.ctx, time.Minute, func() bool {
		now, err := sumMetric(e.promotions, "promotion_outbox_relay_step_backs_total")
		refused = refused || e.logged(e.promotions, notEnoughReplicas)
		return err == nil && now > stepBacks && refused
	}); !ok {
		e.violate("no relay stepped back on %q within a minute (logged: %t)", notEnoughReplicas, refused)
	}
	e.expectAlert("PromotionOutboxBacklogHigh", true, time.Minute)
	time.Sleep(time.Until(downAt.Add(30 * time.Second))) // the length of the outage, not a synchronisation
	created := tr.created.Load()
	relayed := e.relayedTotal()
	upAt := time.Now()
	e.s.nodes(t, "up", 2)
	resumed := e.waitRelayed(relayed, 2*time.Minute, "after a broker came back")
	e.expectAlert("PromotionOutboxBacklogHigh", false, 5*time.Minute)
	drained := time.Since(upAt)
	e.s.nodes(t, "up", 3)
	e.waitISR(3, 2*time.Minute)
	e.setDetail("brokers 2 and 3 down for 30s: writes refused with NOT_ENOUGH_REPLICAS, the relay stepped back, %d purchases created by then, backlog alert fired; the relay published again %s after broker 2 was started, and the alert resolved %s after it",
		created, resumed.Round(100*time.Millisecond), drained.Round(time.Second))
	return tr.end(t)
}

// killController (d): under load the active KRaft controller is killed
// with -9. Another controller leads the quorum within a minute and makes a
// metadata change (a topic is created), the relay keeps publishing; the
// controller starts again.
func killController(t *testing.T, e *env) int {
	tr := e.drive(150, 0.2)
	tr.waitCreated(100, 30*time.Second, "before the kill")
	watch := e.watchPosition()
	active, err := e.s.activeController(e.ctx)
	must(t, err)
	killedAt := time.Now()
	e.s.nodes(t, "kill", active)
	e.fault()
	var next int32
	failover, ok := eventually(e.ctx, time.Minute, func() bool {
		next, err = e.s.activeController(e.ctx)
		return err == nil && next != active
	})
	if !ok {
		e.violate("no other controller led the quorum within a minute of the kill of %d (%v)", active, err)
	}
	probe := "pf-faults-failover-" + suffix()
	if admin, err := e.s.admin(); err != nil {
		e.violate("admin after the failover: %v", err)
	} else {
		if err := admin.CreateTopic(probe, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 3}, false); err != nil {
			e.violate("the new controller did not create a topic: %v", err)
		}
		_ = admin.DeleteTopic(probe)
		admin.Close()
	}
	relayed := e.relayedTotal()
	e.waitRelayed(relayed, time.Minute, "after the failover")
	tr.waitCreated(100, 30*time.Second, "after the failover")
	upAt := time.Now()
	e.s.nodes(t, "up", active)
	e.setDetail("controller %d killed; controller %d led the quorum %s later and created a topic; %s", active, next,
		failover.Round(100*time.Millisecond), stallLine(watch, killedAt, upAt))
	watch.close()
	return tr.end(t)
}

// killCoordinatorMidRebalance (e): under load a third catalog process joins
// the group, and while the group rebalances (its state is no longer
// Stable) the broker that coordinates it is killed with -9. The group
// settles, Stable with its three members, on another coordinator within 2
// minutes, and the consumers catch up (the checker); the broker starts again.
func killCoordinatorMidRebalance(t *testing.T, e *env) int {
	tr := e.drive(150, 0.2)
	tr.waitCreated(100, 30*time.Second, "before the rebalance")
	coord, err := e.s.coordinator(e.group)
	must(t, err)
	rebalancing := make(chan string, 1)
	stop := make(chan struct{})
	go func() {
		for {
			if state, _, err := e.s.groupState(e.group); err == nil && state != "Stable" {
				rebalancing <- state
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	joiner := e.addCatalog(t)
	var state string
	select {
	case state = <-rebalancing:
		e.s.nodes(t, "kill", coord)
		e.fault()
	case <-time.After(time.Minute):
		close(stop)
		e.violate("the group did not rebalance within a minute of %s joining", joiner.name)
		return tr.end(t)
	}
	var now int32
	var members int
	settled, ok := eventually(e.ctx, 2*time.Minute, func() bool {
		var st string
		st, members, err = e.s.groupState(e.group)
		if err != nil || st != "Stable" || members != 3 {
			return false
		}
		now, err = e.s.coordinator(e.group)
		return err == nil && now != coord
	})
	if !ok {
		e.violate("the group did not settle with 3 members on another coordinator within 2 minutes (members %d, coordinator %d, %v)",
			members, now, err)
	}
	tr.waitCreated(100, 30*time.Second, "after the coordinator's kill")
	e.s.nodes(t, "up", coord)
	e.waitISR(3, 2*time.Minute)
	e.setDetail("broker %d coordinated the group and was killed while it was %s; the group was Stable with 3 members on broker %d %s later",
		coord, state, now, settled.Round(100*time.Millisecond))
	return tr.end(t)
}

// addCatalog starts one more catalog process in the scenario.
func (e *env) addCatalog(t *testing.T) *proc {
	p := e.newProc("catalog", len(e.catalogs)+1)
	e.mu.Lock()
	e.catalogs = append(e.catalogs, p)
	e.mu.Unlock()
	p.start(t)
	e.s.prom.scrape(t, e.all())
	return p
}

// logged says whether the log of one of procs holds text.
func (e *env) logged(procs []*proc, text string) bool {
	for _, p := range procs {
		raw, err := os.ReadFile(p.logs)
		if err == nil && strings.Contains(string(raw), text) {
			return true
		}
	}
	return false
}

// setDetail is what the scenario measured besides, for its line.
func (e *env) setDetail(format string, args ...any) {
	e.mu.Lock()
	e.detail = fmt.Sprintf(format, args...)
	e.mu.Unlock()
}
