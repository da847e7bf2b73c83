//go:build faults

package faults

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// threeExpirers: 3 promotion instances race on a burst of purchases that all
// end at once; each must expire exactly once, with one event.
func threeExpirers(t *testing.T, e *env) int {
	n := size(2000, 10000)
	ids, endsAt := e.burst(n, 300)
	if len(ids) != n {
		e.violate("created %d of %d purchases", len(ids), n)
	}
	time.Sleep(time.Until(endsAt))
	e.waitExpired(2 * time.Minute)
	var expired int
	must(t, e.db.Get(&expired, `SELECT count(*) FROM promotion.promotion_purchases WHERE status = 'Expired'`))
	if expired != len(ids) {
		e.violate("%d of %d purchases expired", expired, len(ids))
	}
	return 2 * len(ids)
}

// waitExpired waits until no due purchase is Active.
func (e *env) waitExpired(timeout time.Duration) {
	eventually(e.ctx, timeout, func() bool {
		var due int
		return e.db.Get(&due, `SELECT count(*) FROM promotion.promotion_purchases WHERE status = 'Active' AND ends_at <= now()`) == nil && due == 0
	})
}

// killMidBatch: kill -9 of a promotion process while its expirer holds a
// batch's transaction; the other instance expires everything, and one copy
// of two going away is not a page.
func killMidBatch(t *testing.T, e *env) int {
	n := size(3000, 10000)
	ids, endsAt := e.burst(n, 300)
	time.Sleep(time.Until(endsAt))
	victim := e.promotions[0]
	// Mid batch: the victim's session is inside a transaction on the
	// purchases. A batch lasts milliseconds, hence the tight loop.
	ok := false
	for deadline := time.Now().Add(30 * time.Second); !ok && time.Now().Before(deadline); {
		var busy int
		_ = e.db.Get(&busy, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1
			AND state IN ('active', 'idle in transaction') AND query ILIKE '%promotion_purchases%'`, victim.name)
		ok = busy > 0
	}
	if !ok {
		e.violate("%s was never seen inside an expirer batch", victim.name)
	}
	victim.kill()
	e.fault()
	e.expectAlert("PromotionProcessesDown", false, 5*time.Second)
	e.waitExpired(2 * time.Minute)
	if e.s.prom.firing("PromotionExpireJobStalled") {
		e.violate("PromotionExpireJobStalled fired while one of two instances ran")
	}
	victim.start(t)
	return 2 * len(ids)
}

// relayed is a process's promotion_outbox_relayed_total, or -1.
func relayed(p *proc) float64 {
	resp, err := http.Get("http://" + p.addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "promotion_outbox_relayed_total "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}

// killRelayHolder: kill -9 of the promotion process that relays the outbox,
// while it relays; the other takes over. Then every promotion process goes:
// the stall and down alerts fire, and resolve once one is back.
func killRelayHolder(t *testing.T, e *env) int {
	tr := e.drive(150, 0.2)
	var holder *proc
	eventually(e.ctx, 30*time.Second, func() bool {
		before := map[*proc]float64{}
		for _, p := range e.promotions {
			before[p] = relayed(p)
		}
		time.Sleep(300 * time.Millisecond)
		for _, p := range e.promotions {
			if relayed(p) > before[p] {
				holder = p
				return true
			}
		}
		return false
	})
	if holder == nil {
		e.violate("no promotion process was seen relaying")
		holder = e.promotions[0]
	}
	holder.kill()
	e.fault()
	time.Sleep(3 * time.Second) // traffic goes on; the other instance takes the relay over
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

// killCatalog: kill -9 of the only catalog process while it consumes; while it
// is down under traffic, the lag alert fires; it catches up after a restart.
func killCatalog(t *testing.T, e *env) int {
	tr := e.drive(150, 0.2)
	time.Sleep(2 * time.Second)
	victim := e.catalogs[0]
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
