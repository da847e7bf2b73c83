//go:build faults

package faults

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/promoflow/promoflow/handlers/outbox"
)

// Release N and N−1 run side by side on N's schema, in any mix of
// processes: the previous release's processes (the scenario's, started by
// newEnv) run beside the binary under test's, two promotion and two catalog
// processes each, under traffic.

const (
	// upgradeRate is the traffic's purchases a second.
	upgradeRate = 20
	// commitToKafkaBound is the most a purchase's first event may take from
	// its commit (the API's 201) to the topic (the record's timestamp), p99,
	// while both releases run.
	commitToKafkaBound = time.Second
	// overlapExpiries end during the overlap, one every overlapExpiryEvery.
	overlapExpiries     = 20
	overlapExpiryEvery  = 400 * time.Millisecond
	holderSeenTimeout   = 30 * time.Second
	mixedGroupTimeout   = time.Minute
	aloneUnderTraffic   = 150 // purchases created while one release runs alone
	aloneTrafficTimeout = 30 * time.Second
)

// builtRelease is the previous release with its binary, and the version
// under test.
type builtRelease struct {
	release
	bin     string
	current string // VERSION
}

// previous builds the previous release once per run (cached across runs);
// a release that cannot be built fails the scenario, never skips it.
func (s *suite) previous(t *testing.T) builtRelease {
	t.Helper()
	s.previousOnce.Do(func() {
		start := time.Now()
		current, prev, err := repoPreviousRelease(s.root)
		var cache, bin string
		if err == nil {
			cache, err = releaseCache()
		}
		if err == nil {
			bin, err = buildRelease(context.Background(), s.root, cache, prev)
		}
		s.previousBuilt, s.previousErr = builtRelease{release: prev, bin: bin, current: current}, err
		t.Logf("previous release %s: %s, ready in %s", prev, bin, time.Since(start).Round(time.Millisecond))
	})
	if s.previousErr != nil {
		t.Fatalf("the previous release: %v", s.previousErr)
	}
	return s.previousBuilt
}

// mixed is a scenario's two releases: the previous one's processes and the
// ones under test (head), promotions first in each.
type mixed struct {
	e              *env
	rel            builtRelease
	previous, head []*proc
	// aloneFrom is when traffic started on the previous release alone;
	// overlapFrom and overlapTo bound the time both releases ran, up to
	// the handover, which ends at handedOver.
	aloneFrom, overlapFrom, overlapTo, handedOver time.Time
	// expiries are EndsAt → card of the purchases that ended in the overlap.
	expiries []time.Duration
	notes    []string
}

// mixWithHead makes the head's processes beside the env's (the previous
// release's), not started yet: they are in the env's lists before traffic
// starts, deliberately down until started.
func (e *env) mixWithHead(t *testing.T) *mixed {
	m := &mixed{e: e, rel: e.s.previous(t), previous: e.all()}
	var promotions, catalogs []*proc
	for i := range len(e.promotions) {
		promotions = append(promotions, e.newProc("promotion", len(e.promotions)+i+1))
	}
	for i := range len(e.catalogs) {
		catalogs = append(catalogs, e.newProc("catalog", len(e.catalogs)+i+1))
	}
	for _, p := range append(promotions, catalogs...) {
		// Until the migrations are the explicit step of a deployment.
		p.env = []string{"MIGRATE_ON_START=true"}
		p.goDown("")
	}
	e.mu.Lock()
	e.promotions = append(e.promotions, promotions...)
	e.catalogs = append(e.catalogs, catalogs...)
	e.mu.Unlock()
	m.head = append(promotions, catalogs...)
	return m
}

// version names the release a process runs.
func (m *mixed) version(p *proc) string {
	if slices.Contains(m.head, p) {
		return m.rel.current
	}
	return m.rel.version
}

func (m *mixed) note(format string, args ...any) {
	m.notes = append(m.notes, fmt.Sprintf(format, args...))
}

// startHead runs the head's migrate up, starts its processes and runs both
// releases side by side: the consumer group Stable with catalogs of both
// consuming, purchases expiring on the way.
func (m *mixed) startHead(t *testing.T, tr *traffic) {
	e := m.e
	out, err := exec.CommandContext(e.ctx, e.s.bin, "migrate", "up", "--database-url", e.dbURL, "--log-level", "warn").CombinedOutput()
	if err != nil {
		t.Fatalf("migrate up of %s: %v\n%s", m.rel.current, err, out)
	}
	m.note("%s's migrate up: %s", m.rel.current, strings.TrimSpace(string(out)))
	for _, p := range m.head {
		p.start(t)
	}
	e.fault()
	m.overlapFrom = time.Now()
	e.s.prom.scrape(t, m.running())
	start := time.Now()
	ids := e.createEnding(overlapExpiries, func(i int) time.Time {
		return start.Add(3*time.Second + time.Duration(i)*overlapExpiryEvery)
	})
	done := make(chan []time.Duration, 1)
	go func() { done <- e.watchExpiries(ids, time.Minute) }()
	m.waitMixedGroup()
	tr.waitCreated(upgradeRate, aloneTrafficTimeout, "while both releases run")
	m.expiries = <-done
	if len(m.expiries) < len(ids) {
		e.violate("%d of %d expiries during the overlap never reached the catalog", len(ids)-len(m.expiries), len(ids))
	}
}

// running are the scenario's processes that run now.
func (m *mixed) running() []*proc {
	var out []*proc
	for _, p := range append(slices.Clone(m.previous), m.head...) {
		if p.alive() {
			out = append(out, p)
		}
	}
	return out
}

// waitMixedGroup waits until the consumer group is Stable and catalogs of
// both releases in it consume.
func (m *mixed) waitMixedGroup() {
	e := m.e
	var state string
	var members int
	var err error
	if _, ok := eventually(e.ctx, mixedGroupTimeout, func() bool {
		state, members, err = e.s.groupState(e.group)
		return err == nil && state == "Stable" && members >= 2*len(m.catalogs(m.previous))
	}); !ok {
		e.violate("consumer group %s with both releases: %s with %d members (%v), want Stable with %d", e.group, state, members, err,
			2*len(m.catalogs(m.previous)))
		return
	}
	consumed := func(procs []*proc) float64 {
		v, _ := sumMetric(procs, "catalog_promotion_consumed_total")
		return v
	}
	prev, head := m.catalogs(m.previous), m.catalogs(m.head)
	prev0, head0 := consumed(prev), consumed(head)
	if _, ok := eventually(e.ctx, mixedGroupTimeout, func() bool {
		return consumed(prev) > prev0 && consumed(head) > head0
	}); !ok {
		e.violate("catalogs of both releases did not consume in one group: %s's %v → %v, %s's %v → %v", m.rel.version, prev0,
			consumed(prev), m.rel.current, head0, consumed(head))
		return
	}
	m.note("group Stable with %d members, catalogs of both releases consuming", members)
}

func (m *mixed) catalogs(procs []*proc) []*proc {
	return slices.DeleteFunc(slices.Clone(procs), func(p *proc) bool { return p.job != "catalog" })
}

func (m *mixed) promotions(procs []*proc) []*proc {
	return slices.DeleteFunc(slices.Clone(procs), func(p *proc) bool { return p.job != "promotion" })
}

// holder waits until one of procs is seen holding the relay's outbox
// position, and returns it (nil after timeout).
func (m *mixed) holder(procs []*proc, timeout time.Duration) *proc {
	var seen *proc
	var err error
	eventually(m.e.ctx, timeout, func() bool {
		var sessions []outbox.RelaySession
		sessions, err = outbox.RelaySessions(m.e.ctx, m.e.db)
		for _, s := range sessions {
			for _, p := range procs {
				if s.Holder && s.Application == p.name {
					seen = p
				}
			}
		}
		return seen != nil
	})
	if err != nil {
		m.e.violate("the relay's sessions: %v", err)
	}
	return seen
}

// handOver stops the release of from: its promotion seen holding the relay's
// position first, then the rest, which ends the overlap. The position
// moves to a process of to.
func (m *mixed) handOver(t *testing.T, from, to []*proc) {
	e := m.e
	held := m.holder(m.promotions(from), holderSeenTimeout)
	if held == nil {
		e.violate("no %s process was seen holding the relay's position within %s", m.version(from[0]), holderSeenTimeout)
		held = from[0]
	}
	m.overlapTo = time.Now()
	held.stop()
	stoppedAt := time.Now()
	for _, p := range from {
		p.stop()
	}
	e.fault()
	e.s.prom.scrape(t, m.running())
	taker := m.holder(m.promotions(to), holderSeenTimeout)
	m.handedOver = time.Now()
	if taker == nil {
		e.violate("no %s process took the relay's position within %s of %s's stop", m.version(to[0]), holderSeenTimeout, held.name)
		return
	}
	m.note("relay position %s (%s) → %s (%s), seen %s after the holder's stop", held.name, m.version(held), taker.name,
		m.version(taker), time.Since(stoppedAt).Round(100*time.Millisecond))
}

// finish ends the traffic, retires the stopped release's processes, and
// checks and reports what both releases did in the overlap.
func (m *mixed) finish(t *testing.T, tr *traffic, stopped []*proc) int {
	e := m.e
	events := tr.end(t) + 2*overlapExpiries
	e.retire(stopped)
	expiry := m.bounded("EndsAt → card", m.expiries, expiryToCardBound, "")
	m.waitRelayed()
	// A commit within the bound of the handover's start may wait for the
	// handover; one before that is late by then whatever the handover does.
	handover := m.overlapTo.Add(-commitToKafkaBound)
	// Reported, not bounded: the previous release alone (what the machine
	// gives, which a failed bound is to be read against), and the handover,
	// where a holder stopped mid-page makes the taker wait the position
	// guard's TakeoverWait (handlers/outbox/guard.go).
	var others []string
	for _, w := range []struct {
		what     string
		from, to time.Time
	}{{"before the overlap", m.aloneFrom, m.overlapFrom}, {"across the handover", handover, m.handedOver}} {
		if ds := m.commitToKafka(w.from, w.to); len(ds) > 0 {
			_, p99, top := quantiles(ds)
			others = append(others, fmt.Sprintf("%s p99 %s max %s over %d", w.what, p99.Round(time.Millisecond), top.Round(time.Millisecond), len(ds)))
		}
	}
	commit := m.bounded("commit → Kafka", m.commitToKafka(m.overlapFrom, handover), commitToKafkaBound, strings.Join(others, "; "))
	errLines := 0
	for _, p := range append(slices.Clone(m.previous), m.head...) {
		n, err := p.count(errorLine)
		if err != nil {
			e.violate("%v", err)
		}
		errLines += n
	}
	if n := tr.serverErrors.Load(); n > 0 {
		e.violate("%d answers were 5xx while the releases were mixed", n)
	}
	e.setDetail("%s and %s: 5xx %d; overlap %s: %s; %s; %s; ERROR log lines %d", m.rel, m.rel.current, tr.serverErrors.Load(),
		m.overlapTo.Sub(m.overlapFrom).Round(time.Second), expiry, commit, strings.Join(m.notes, "; "), errLines)
	return events
}

// errorLine is a log line at level ERROR.
var errorLine = regexp.MustCompile(`"level":"ERROR"`)

// bounded reports the p50, p99 and max of delays, then beside (what to
// read them against), and wants the p99 within bound.
func (m *mixed) bounded(what string, delays []time.Duration, bound time.Duration, beside string) string {
	if beside != "" {
		beside = "; " + beside
	}
	if len(delays) == 0 {
		m.e.violate("%s: nothing measured during the overlap", what)
		return what + ": none" + beside
	}
	p50, p99, top := quantiles(delays)
	if p99 > bound {
		m.e.violate("%s p99 %s during the overlap, over %s%s", what, p99.Round(time.Millisecond), bound, beside)
	}
	return fmt.Sprintf("%s p50 %s p99 %s max %s over %d%s", what, p50.Round(time.Millisecond), p99.Round(time.Millisecond),
		top.Round(time.Millisecond), len(delays), beside)
}

// quantiles are the p50, p99 and max of delays (sorted in place).
func quantiles(delays []time.Duration) (p50, p99, top time.Duration) {
	slices.Sort(delays)
	return delays[len(delays)/2], delays[(len(delays)*99)/100], delays[len(delays)-1]
}

// waitRelayed waits until the outbox is relayed.
func (m *mixed) waitRelayed() {
	e := m.e
	if _, ok := eventually(e.ctx, time.Minute, func() bool {
		stats, err := outbox.ReadStats(e.ctx, e.db)
		return err == nil && stats.Backlog == 0
	}); !ok {
		e.violate("the outbox was not relayed within a minute of the traffic's end")
	}
}

// commitToKafka is, for each purchase answered 201 from from to to, the
// time from that answer to its first record's timestamp.
func (m *mixed) commitToKafka(from, to time.Time) []time.Duration {
	e := m.e
	_, records, err := readTopic(e.ctx, e.s.cluster(), e.topic)
	if err != nil {
		e.violate("%v", err)
		return nil
	}
	first := map[string]topicRecord{}
	for _, r := range records {
		if f, ok := first[r.Key]; !ok || r.Offset < f.Offset {
			first[r.Key] = r
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var delays []time.Duration
	for key, r := range first {
		id, err := uuid.Parse(key)
		if err != nil {
			continue
		}
		if at, ok := e.answered[id]; ok && !at.Before(from) && !at.After(to) {
			delays = append(delays, r.Timestamp.Sub(at))
		}
	}
	return delays
}

// retire moves stopped processes out of the env's lists (after the
// traffic's end: the traffic reads them): finish still reads their logs.
func (e *env) retire(procs []*proc) {
	e.mu.Lock()
	defer e.mu.Unlock()
	keep := func(list []*proc) []*proc {
		return slices.DeleteFunc(list, func(p *proc) bool { return slices.Contains(procs, p) })
	}
	e.promotions, e.catalogs = keep(e.promotions), keep(e.catalogs)
	e.retired = append(e.retired, procs...)
}

// upgradeUnderTraffic: (a, c) the previous release runs (two promotion, two
// catalog processes) under traffic; the head's migrate up; the head's
// processes start beside it: one consumer group with catalogs of both
// releases consuming, purchases expiring; the previous release's processes
// stop, its relay position holder first, and a head process takes the
// position. Then the head runs alone under traffic. No 5xx; during the
// overlap EndsAt → card p99 within expiryToCardBound and commit → Kafka p99
// within commitToKafkaBound.
func upgradeUnderTraffic(t *testing.T, e *env) int {
	m := e.mixWithHead(t)
	m.aloneFrom = time.Now()
	tr := e.drive(upgradeRate, 0.2)
	tr.waitCreated(upgradeRate, aloneTrafficTimeout, "on the previous release alone")
	m.startHead(t, tr)
	m.handOver(t, m.previous, m.head)
	tr.waitCreated(aloneUnderTraffic, aloneTrafficTimeout, "on the head alone")
	return m.finish(t, tr, m.previous)
}

// rollbackOnHeadSchema: (b, c) as upgradeUnderTraffic up to the overlap;
// then the head's processes stop, its relay position holder first, and a
// process of the previous release takes the position back: the previous
// release runs alone on the head's schema under traffic, with the same
// bounds.
func rollbackOnHeadSchema(t *testing.T, e *env) int {
	m := e.mixWithHead(t)
	m.aloneFrom = time.Now()
	tr := e.drive(upgradeRate, 0.2)
	tr.waitCreated(upgradeRate, aloneTrafficTimeout, "on the previous release alone")
	m.startHead(t, tr)
	m.handOver(t, m.head, m.previous)
	tr.waitCreated(aloneUnderTraffic, aloneTrafficTimeout, "on the previous release alone on the head's schema")
	return m.finish(t, tr, m.head)
}
