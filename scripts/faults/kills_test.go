//go:build faults

package faults

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lib/pq"
)

// threeExpirers: 3 promotion instances run their expirers on a burst of
// purchases that all end at one instant (and half as many more that end in
// hours). Every due purchase is Expired within 2 minutes, and the checker
// finds each with one v1 Active and one v2 Expired event, no more.
func threeExpirers(t *testing.T, e *env) int {
	n := size(2000, 10000)
	ids, endsAt := e.burst(n, 300)
	if len(ids) != n {
		e.violate("created %d of %d due purchases", len(ids), n)
	}
	time.Sleep(time.Until(endsAt))
	e.waitExpired(2 * time.Minute)
	e.wantStatus(ids, "Expired", len(ids))
	// Racing: the burst is shared, more than one instance expires some of it.
	var shares []string
	working := 0
	for _, p := range e.promotions {
		v, err := metric(p, `promotion_expire_items_total{outcome="expired"}`)
		if err != nil {
			e.violate("%v", err)
		}
		if v > 0 {
			working++
		}
		shares = append(shares, fmt.Sprintf("%s %v", p.name, v))
	}
	if working < 2 {
		e.violate("one expirer did the whole burst, none raced it: %v", shares)
	}
	e.setDetail("expired by %v", shares)
	return 2 * len(ids)
}

// waitExpired waits until no due purchase is Active; a violation when that
// takes longer than timeout.
func (e *env) waitExpired(timeout time.Duration) {
	var due int
	var err error
	if _, ok := eventually(e.ctx, timeout, func() bool {
		err = e.db.Get(&due, `SELECT count(*) FROM promotion.promotion_purchases WHERE status = 'Active' AND ends_at <= now()`)
		return err == nil && due == 0
	}); !ok {
		e.violate("due purchases still Active after %s: %d (%v)", timeout, due, err)
	}
}

// wantStatus wants want of the purchases ids in status.
func (e *env) wantStatus(ids map[string]string, status string, want int) {
	list := make([]string, 0, len(ids))
	for id := range ids {
		list = append(list, id)
	}
	var got int
	if err := e.db.Get(&got, `SELECT count(*) FROM promotion.promotion_purchases WHERE status = $1 AND id = ANY($2::uuid[])`,
		status, pq.Array(list)); err != nil {
		e.violate("count %s purchases: %v", status, err)
	} else if got != want {
		e.violate("%d of %d purchases are %s, want %d", got, len(ids), status, want)
	}
}

// Statements that show, in pg_stat_activity, a session inside one of the
// transactions a kill must hit.
const (
	// expirerBatchSQL: an expirer batch (handlers/expire/batch.go) after it
	// locked its rows: the SKIP LOCKED select, the savepoint, the UPDATE of
	// the transitions, the outbox row.
	expirerBatchSQL = `FOR UPDATE SKIP LOCKED|SAVEPOINT expire_set|SET status = u\.status|INSERT INTO "?promotion\.outbox_messages`
	// relaySQL: the relay's page read under the locked offsets row, or its
	// ack (handlers/outbox/relayschema.go, watermill-sql's offsets adapter).
	relaySQL = `outbox_relay_position|INSERT INTO promotion\.outbox_offsets`
	// unitOfWorkSQL: the consumer's unit of work (middleware/groupcommit.go,
	// handlers/boost): the dedup keys, the target locks, the contributions.
	unitOfWorkSQL = `INSERT INTO catalog\.processed_messages|pg_advisory_xact_lock|INSERT INTO catalog\.promotion_contributions`
)

// freezeInside freezes (SIGSTOP) one of procs while its session is inside a
// transaction whose current or last statement matches pattern, not waiting
// on a lock (so it holds what it locked), and confirms after the freeze that
// the same transaction is still open there: a frozen process cannot commit
// it. It returns the frozen process, or nil after timeout.
func (e *env) freezeInside(procs []*proc, pattern string, timeout time.Duration) *proc {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		seen, err := e.inside(procs, pattern)
		if err != nil {
			e.violate("pg_stat_activity: %v", err)
			return nil
		}
		for _, s := range seen {
			var p *proc
			for _, c := range procs {
				if c.name == s.App {
					p = c
				}
			}
			p.freeze()
			var still int
			err := e.db.Get(&still, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND xact_start = $3 AND `+insideSQL,
				s.PID, pattern, s.Start)
			if err == nil && still == 1 {
				return p
			}
			p.thaw()
		}
	}
	return nil
}

// insideSQL selects the sessions inside a transaction whose current or last
// statement matches $2, not waiting on a lock (so they hold what they locked).
const insideSQL = `xact_start IS NOT NULL AND query ~ $2
	AND (state = 'idle in transaction' OR (state = 'active' AND wait_event_type IS DISTINCT FROM 'Lock'))`

// session is a PostgreSQL session of one of the scenario's processes.
type session struct {
	PID   int       `db:"pid"`
	App   string    `db:"application_name"`
	Start time.Time `db:"xact_start"`
}

// inside lists the sessions of procs inside a transaction of pattern (insideSQL).
func (e *env) inside(procs []*proc, pattern string) ([]session, error) {
	names := make([]string, len(procs))
	for i, p := range procs {
		names[i] = p.name
	}
	var seen []session
	err := e.db.Select(&seen, `SELECT pid, application_name, xact_start FROM pg_stat_activity
		WHERE application_name = ANY($1) AND `+insideSQL, pq.Array(names), pattern)
	return seen, err
}

// watchQuiet watches, until stopped, that none of alerts fires; a firing
// alert or a Prometheus that cannot answer is a violation.
func (e *env) watchQuiet(alerts ...string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		reported := map[string]bool{}
		for {
			states, err := e.s.prom.alertStates()
			if err != nil {
				e.violate("watch %v: %v", alerts, err)
				return
			}
			for _, a := range alerts {
				if states[a] == "firing" && !reported[a] {
					reported[a] = true
					e.violate("alert %s fired", a)
				}
			}
			select {
			case <-done:
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// seenDown waits until Prometheus has scraped p as down.
func (e *env) seenDown(p *proc, timeout time.Duration) bool {
	var err error
	_, ok := eventually(e.ctx, timeout, func() bool {
		var up float64
		up, err = e.s.prom.one(fmt.Sprintf(`up{instance=%q}`, p.internal))
		return err != nil || up == 0
	})
	if err != nil {
		e.violate("up of %s: %v", p.name, err)
		return false
	}
	if !ok {
		e.violate("Prometheus did not scrape %s down within %s", p.name, timeout)
	}
	return ok
}

// quietAfterDown is how long an alert must stay quiet after Prometheus
// scraped a process down: many scrape and evaluation intervals (1s), and
// over the for: (2s) plus the range (4s) of the scaled promotion rules.
const quietAfterDown = 15 * time.Second

// killMidBatch: a burst of purchases ends at one instant on two promotion
// instances. The victim is frozen while its session holds an expirer batch's
// transaction open (its rows locked: the SKIP LOCKED select, the savepoint,
// the UPDATE or the outbox row is its statement, before and after the
// freeze), then killed with -9. While the victim stays down the other
// instance expires every due purchase, and one copy of two going away is
// not a page: from the kill until quietAfterDown after Prometheus scraped
// the victim down (and the expiry is done), PromotionProcessesDown and
// PromotionExpireJobStalled never fire.
func killMidBatch(t *testing.T, e *env) int {
	n := size(3000, 10000)
	ids, endsAt := e.burst(n, 300)
	time.Sleep(time.Until(endsAt))
	victim := e.freezeInside(e.promotions[:1], expirerBatchSQL, 30*time.Second)
	if victim == nil {
		e.violate("%s was never seen inside an expirer batch", e.promotions[0].name)
		victim = e.promotions[0]
	}
	victim.kill()
	e.fault()
	stop := e.watchQuiet("PromotionProcessesDown", "PromotionExpireJobStalled")
	if e.seenDown(victim, 30*time.Second) {
		quietUntil := time.Now().Add(quietAfterDown)
		e.waitExpired(2 * time.Minute)
		time.Sleep(time.Until(quietUntil)) // the watch's window, not a synchronisation
	}
	stop()
	e.wantStatus(ids, "Expired", len(ids))
	victim.start(t)
	return 2 * len(ids)
}

// metric sums the samples of a series a process exposes, named as in the
// exposition with its labels (e.g. `x_total{outcome="applied"}`) or bare for
// the whole family. A process that does not answer, or has no such series,
// is an error.
func metric(p *proc, name string) (float64, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + p.internal + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("metrics of %s: %w", p.name, err)
	}
	defer resp.Body.Close()
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+" ") || (!strings.Contains(name, "{") && strings.HasPrefix(line, name+"{")) {
			f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				return 0, fmt.Errorf("metrics of %s: %q: %w", p.name, line, err)
			}
			sum += f
			found = true
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("metrics of %s: %w", p.name, err)
	}
	if !found {
		return 0, fmt.Errorf("metrics of %s: no series %s", p.name, name)
	}
	return sum, nil
}

// killRelayHolder: under traffic, the promotion process whose session holds
// the relay's transaction open (the outbox page read under the locked
// offsets row, or its ack not committed; seen before and after a freeze) is
// killed with -9. While it is down the other process's
// promotion_outbox_relayed_total rises: it took the relay over. Then every
// promotion process is killed: PromotionProcessesDown and
// PromotionExpireJobStalled fire, and resolve once both are back.
func killRelayHolder(t *testing.T, e *env) int {
	tr := e.drive(150, 0.2)
	holder := e.freezeInside(e.promotions, relaySQL, 30*time.Second)
	if holder == nil {
		e.violate("no promotion process was seen inside the relay's transaction")
		holder = e.promotions[0]
	}
	holder.kill()
	e.fault()
	other := e.promotions[0]
	if other == holder {
		other = e.promotions[1]
	}
	before, err := metric(other, "promotion_outbox_relayed_total")
	if err != nil {
		e.violate("%v", err)
	}
	var now float64
	if _, ok := eventually(e.ctx, 30*time.Second, func() bool {
		now, err = metric(other, "promotion_outbox_relayed_total")
		return err != nil || now > before
	}); err != nil || !ok {
		e.violate("%s did not take the relay over while %s was down: relayed %v, then %v (%v)", other.name, holder.name, before, now, err)
	}
	holder.start(t)
	tr.halt()

	for _, p := range e.promotions {
		p.kill()
	}
	e.fault()
	e.expectAlert("PromotionProcessesDown", true, 30*time.Second)
	e.expectAlert("PromotionExpireJobStalled", true, 30*time.Second)
	e.promotions[0].start(t)
	e.promotions[1].start(t)
	e.expectAlert("PromotionProcessesDown", false, 30*time.Second)
	e.expectAlert("PromotionExpireJobStalled", false, 30*time.Second)
	t.Logf("traffic: %s", tr)
	return int(tr.created.Load())*2 + int(tr.cancels.Load())
}

// killCatalog: under traffic, the only catalog process is frozen while its
// unit of work holds a transaction open (dedup keys, target locks or
// contributions written and not committed, seen before and after the
// freeze): the messages in it were consumed and their transaction is open.
// It is killed with -9. While it is down under traffic
// CatalogProcessesDown and CatalogPromotionLagHigh fire; after a restart it
// catches up (the checker at quiescence) and both resolve.
func killCatalog(t *testing.T, e *env) int {
	tr := e.drive(150, 0.2)
	victim := e.freezeInside(e.catalogs, unitOfWorkSQL, 30*time.Second)
	if victim == nil {
		e.violate("%s was never seen inside a unit of work", e.catalogs[0].name)
		victim = e.catalogs[0]
	}
	victim.kill()
	e.fault()
	e.expectAlert("CatalogProcessesDown", true, 30*time.Second)
	e.expectAlert("CatalogPromotionLagHigh", true, 30*time.Second)
	victim.start(t)
	tr.halt()
	e.expectAlert("CatalogProcessesDown", false, 30*time.Second)
	e.expectAlert("CatalogPromotionLagHigh", false, 60*time.Second)
	t.Logf("traffic: %s", tr)
	return int(tr.created.Load())*2 + int(tr.cancels.Load())
}
