//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os/exec"
	"testing"
	"time"

	"github.com/google/uuid"
)

// asyncFailover crashes the primary of an asynchronous pair under traffic
// after its standby fell behind (cut off from the primary, as under a lag),
// promotes the standby, and starts a new standby of it, as Patroni or
// CloudNativePG re-clone the old primary. What the primary answered 201 for
// while its standby was cut off is lost with it: those ids go to e.lost, and
// only those. Unless flushed (the relays wait for the standby), it waits
// until the relays published changes the standby lacks, so that the topic
// holds phantoms. It returns the traffic, still running on the new primary.
func (e *env) asyncFailover(t *testing.T, flushed bool) *traffic {
	tr := e.drive(100, 0.2)
	tr.waitCreated(100, 30*time.Second, "before the standby falls behind")
	safe := e.createdIDs()
	// Every record published so far is of a change committed before the
	// standby replayed what follows: no phantom lies below these ends.
	from := e.ends()
	e.pair.primary.WaitReplayed(t, e.pair.standby) // everything safe answered is on the standby
	e.pair.standby.Detach(t)
	detached := e.createdIDs()
	tr.waitCreated(100, 30*time.Second, "while the standby is cut off")
	if !flushed {
		// The relays publish what the standby lacks before the crash: on a
		// loaded machine they may still be catching up on older rows.
		// (The standby flush holds them.)
		e.waitPublishedBeyond(detached, 20, time.Minute)
	}
	e.pair.primary.Kill(t)
	e.fault()
	// No create is answered 201 between the crash and the promotion: the
	// ids answered so far are all the old primary acknowledged.
	unavailable := tr.unavailable.Load()
	if _, ok := eventually(e.ctx, 30*time.Second, func() bool { return tr.unavailable.Load() > unavailable }); !ok {
		e.violate("no request got a 503 while no primary ran")
	}
	e.mu.Lock()
	for id := range e.created {
		if !safe[id] {
			e.lost[id] = true
		}
	}
	e.mu.Unlock()
	// The relays lost their sessions with the primary: what they published
	// from it is below these ends.
	e.mu.Lock()
	e.phantomFrom, e.phantomTo = from, e.ends()
	e.mu.Unlock()
	e.pair.standby.Promote(t)
	e.pair.primary, e.pair.standby = e.pair.standby, e.pair.standby.StartStandby(t, standbyName)
	if !e.waitReady(2 * time.Minute) {
		e.violate("the processes did not become ready on the promoted standby without a restart")
	}
	tr.waitCreated(50, time.Minute, "after the failover")
	return tr
}

// ends is topicEnds, a failure recorded as a violation.
func (e *env) ends() map[int32]int64 {
	ends, err := e.topicEnds()
	if err != nil {
		e.violate("%v", err)
	}
	return ends
}

// waitPublishedBeyond waits up to timeout until the topic holds records of
// n purchases that are not in known.
func (e *env) waitPublishedBeyond(known map[uuid.UUID]bool, n int, timeout time.Duration) {
	var beyond int
	if _, ok := eventually(e.ctx, timeout, func() bool {
		_, records, err := readTopic(e.ctx, e.s.cluster(), e.topic)
		if err != nil {
			return false
		}
		seen := map[string]bool{}
		for _, r := range records {
			if id, err := uuid.Parse(r.Key); err == nil && !known[id] {
				seen[r.Key] = true
			}
		}
		beyond = len(seen)
		return beyond >= n
	}); !ok {
		e.violate("the relays published records of %d purchases created while the standby was cut off within %s, want %d", beyond, timeout, n)
	}
}

// createdIDs are the ids answered 201 so far.
func (e *env) createdIDs() map[uuid.UUID]bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.created)
}

// asyncFailoverFlushed: scenario (l) with RELAY_STANDBY_FLUSH naming the
// standby. The relay publishes nothing the standby has not flushed, so no
// record on the topic lacks its row after the failover (0 phantoms). The
// catalog's projection lives in the same cluster, so this is also the
// catalog database's asynchronous failover: every card must equal a
// recompute from the purchases, with no event missing.
func asyncFailoverFlushed(t *testing.T, e *env) int {
	tr := e.asyncFailover(t, true)
	tr.halt()
	e.mu.Lock()
	e.phantomFrom, e.phantomTo = nil, nil // with the flush, no record may be a phantom
	e.mu.Unlock()
	e.detail = fmt.Sprintf("%d answered 201 and lost with the old primary", len(e.lost))
	t.Logf("traffic: %s", tr)
	return int(tr.created.Load())*2 + int(tr.cancels.Load())
}

// reconcileReport is what `promoflow reconcile --json` prints.
type reconcileReport struct {
	Missing, Behind []uuid.UUID
	Repaired        int
}

// asyncFailoverReconciled: scenario (l) without the standby flush. The relay
// published changes the promoted standby never received (phantoms), and
// `promoflow reconcile` finds and repairs every one; a second run finds
// none, and the checker's rules then hold, but the terminal order of the
// repaired purchases.
func asyncFailoverReconciled(t *testing.T, e *env) int {
	tr := e.asyncFailover(t, false)
	tr.halt()
	first := e.reconcile(t)
	phantoms := len(first.Missing) + len(first.Behind)
	if phantoms == 0 {
		e.violate("reconcile found no phantom: the failover published nothing the standby lacked, so the scenario tested nothing")
	}
	e.mu.Lock()
	for _, id := range append(first.Missing, first.Behind...) {
		e.reconciled[id] = true
	}
	e.mu.Unlock()
	// The relay publishes the repairs; a second run finds nothing once it has.
	var again reconcileReport
	if _, ok := eventually(e.ctx, time.Minute, func() bool {
		again = e.reconcile(t)
		return len(again.Missing)+len(again.Behind) == 0
	}); !ok {
		e.violate("a second reconcile still finds %d missing and %d behind", len(again.Missing), len(again.Behind))
	}
	e.detail = fmt.Sprintf("phantoms %d (%d missing, %d behind), repaired %d; %d answered 201 and lost",
		phantoms, len(first.Missing), len(first.Behind), first.Repaired, len(e.lost))
	t.Logf("traffic: %s", tr)
	return int(tr.created.Load())*2 + int(tr.cancels.Load())
}

// reconcile runs `promoflow reconcile --json` on the scenario's database.
func (e *env) reconcile(t *testing.T) reconcileReport {
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, e.s.bin, "reconcile", "--json", "--database-url", e.dbURL,
		"--kafka-brokers", e.s.brokers, "--topic", e.topic, "--log-level", "warn").Output()
	var rep reconcileReport
	if err == nil {
		err = json.Unmarshal(out, &rep)
	}
	if err != nil {
		e.violate("promoflow reconcile: %v: %s", err, out)
	}
	return rep
}
