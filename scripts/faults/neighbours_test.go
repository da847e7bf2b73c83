//go:build faults

package faults

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// expiryToCardBound is the most a purchase's card may keep its boost past the
// purchase's EndsAt (p99) while a neighbour holds a transaction id.
const expiryToCardBound = 2500 * time.Millisecond

// foreignWriter: (i) a transaction in another database of the server holds a
// transaction id for 2 minutes, while purchases reach their EndsAt one a
// second. Only an outbox writer may hold the relay back, so each expiry
// still reaches the catalog: p99 of EndsAt → its contributions inactive
// (written in the transaction that writes its cards' boosts) within
// expiryToCardBound. Every published object also gets a purchase that ends
// in hours, so that the cards the checker compares carry a boost.
func foreignWriter(t *testing.T, e *env) int {
	far := e.createEnding(len(e.objects), func(int) time.Time { return farEndsAt() })
	other, err := sqlx.Open("postgres", e.s.dbBase)
	must(t, err)
	defer other.Close()
	hold := 2 * time.Minute
	ctx, cancel := context.WithTimeout(e.ctx, hold)
	defer cancel()
	conn, err := other.Connx(context.Background())
	must(t, err)
	defer conn.Close()
	var xid int64
	must(t, conn.GetContext(ctx, &xid, `BEGIN; CREATE TEMP TABLE neighbour (i int); INSERT INTO neighbour VALUES (1);
		SELECT pg_current_xact_id()::text::bigint`))
	held := make(chan struct{})
	go func() {
		defer close(held)
		_, _ = conn.ExecContext(ctx, `SELECT pg_sleep($1)`, hold.Seconds())
	}()
	e.fault()
	start := time.Now()

	n := int(hold/time.Second) - 20
	ids := e.createEnding(n, func(i int) time.Time { return start.Add(10*time.Second + time.Duration(i)*time.Second) })
	delays := e.watchExpiries(ids, hold+30*time.Second)
	var running int
	if err := e.db.Get(&running, `SELECT count(*) FROM pg_stat_activity WHERE backend_xid::text::bigint = $1`, xid%(1<<32)); err != nil {
		e.violate("the neighbour: %v", err)
	} else if running != 1 && time.Since(start) < hold {
		e.violate("the neighbour's transaction (id %d) ended before the last expiry", xid)
	}
	cancel()
	<-held
	_, _ = conn.ExecContext(context.Background(), `ROLLBACK`)

	if len(delays) < len(ids) {
		e.violate("%d of %d expiries never reached the catalog", len(ids)-len(delays), len(ids))
	}
	if len(delays) > 0 {
		p50, p99, top := quantiles(delays)
		e.setDetail("EndsAt → card p50 %s p99 %s max %s over %d expiries, a neighbour holding an id for %s",
			p50.Round(time.Millisecond), p99.Round(time.Millisecond), top.Round(time.Millisecond), len(delays), hold)
		if p99 > expiryToCardBound {
			e.violate("EndsAt → card p99 %s, over %s: the neighbour held the relay back", p99, expiryToCardBound)
		}
	}
	return 2*len(ids) + len(far)
}

// createEnding makes n purchases through the API, the i-th (from 0) on one
// of the published objects and ending at endsAt(i), and returns their ids
// with their EndsAt.
func (e *env) createEnding(n int, endsAt func(i int) time.Time) map[string]time.Time {
	tr := e.newTraffic(30 * time.Second)
	out := map[string]time.Time{}
	for i := range n {
		tn := e.tenants[i%len(e.tenants)]
		ends := endsAt(i)
		body := map[string]any{"PackageKind": "Top", "BoostWeight": 5, "EndsAt": ends.UTC().Format(time.RFC3339Nano),
			"Targets": []map[string]string{{"TargetKind": "PropertyObject", "TargetId": e.objects[i%len(e.objects)].String()}}}
		status, resp := tr.call(e.ctx, http.MethodPost, "/promotions", tn.token, body)
		if status != http.StatusCreated {
			e.violate("create %d of %d: %d", i+1, n, status)
			continue
		}
		out[resp["Id"].(string)] = ends
	}
	return out
}

// watchExpiries polls the catalog's replica until each purchase of ids has
// no active contribution left, and returns, for each, how long after its
// EndsAt that was first seen (50 ms polls), until timeout.
func (e *env) watchExpiries(ids map[string]time.Time, timeout time.Duration) []time.Duration {
	list := make([]string, 0, len(ids))
	for id := range ids {
		list = append(list, id)
	}
	seen := map[string]bool{}
	var delays []time.Duration
	for deadline := time.Now().Add(timeout); len(seen) < len(ids) && time.Now().Before(deadline); {
		var done []string
		err := e.db.Select(&done, `SELECT purchase_id::text FROM catalog.promotion_contributions
			WHERE purchase_id = ANY($1::uuid[]) GROUP BY purchase_id HAVING NOT bool_or(active)`, pq.Array(list))
		now := time.Now()
		if err != nil {
			e.violate("read the replica: %v", err)
			return delays
		}
		for _, id := range done {
			if !seen[id] {
				seen[id] = true
				delays = append(delays, now.Sub(ids[id]))
			}
		}
		time.Sleep(50 * time.Millisecond) // the poll's period, not a synchronisation
	}
	return delays
}

// relayHolderPublishingSQL cuts the session of the relay's position holder
// (its transaction's id is the last holder's, promotion.outbox_relay_holder)
// while it is idle in that transaction, publishing a page, if there is one.
const relayHolderPublishingSQL = `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
	WHERE datname = current_database() AND state = 'idle in transaction'
		AND backend_xid::text::bigint = (SELECT last_value FROM promotion.outbox_relay_holder) % 4294967296`

// ackOnBrokenSession is the subscriber's log of a page whose ack failed
// because its session was cut (watermill-sql's message, lib/pq's error).
var ackOnBrokenSession = regexp.MustCompile(`"msg":"Error querying for message".*"could not get args for acking the message: driver: bad connection"`)

// killRelaySession: (j) under traffic and a burst of expiries, the session of
// the promotion process that holds the relay's outbox position is cut
// (pg_terminate_backend) while it publishes a page, three times. The
// process says so (promotion_outbox_relay_position_lost_total), the other
// takes the position, and the checker at quiescence finds nothing lost,
// doubled or out of order: every key's versions first appear in increasing
// offset order.
func killRelaySession(t *testing.T, e *env) int {
	tr := e.drive(100, 0.2)
	ids, endsAt := e.burst(size(3000, 10000), 300)
	time.Sleep(time.Until(endsAt))
	cut := 0
	for deadline := time.Now().Add(time.Minute); cut < 3 && time.Now().Before(deadline); {
		var ended bool
		switch err := e.db.Get(&ended, relayHolderPublishingSQL); {
		case err == nil && ended:
			cut++
			e.fault()
		case err != nil && !errors.Is(err, sql.ErrNoRows):
			e.violate("pg_stat_activity: %v", err)
			return 0
		}
		time.Sleep(20 * time.Millisecond) // the poll's period, not a synchronisation
	}
	if cut == 0 {
		e.violate("no promotion process was seen holding the relay's position")
	}
	e.waitExpired(2 * time.Minute)
	tr.halt()
	e.wantStatus(ids, "Expired", len(ids))
	// A cut the position guard saw is counted (its check of the session
	// failed while the page was published). A cut that came after the
	// page's last publish, before its ack, is said by the subscriber
	// instead: its ack fails on the broken connection, and it reads again.
	var lost float64
	acks := 0
	for _, p := range e.promotions {
		v, err := metric(p, "promotion_outbox_relay_position_lost_total")
		if err != nil {
			e.violate("%v", err)
		}
		lost += v
		n, err := p.count(ackOnBrokenSession)
		if err != nil {
			e.violate("%v", err)
		}
		acks += n
	}
	if lost+float64(acks) < 1 {
		e.violate("the relay's position session was cut %d times, and no process said it lost it", cut)
	}
	e.setDetail("cut the relay holder's session %d times; positions lost %v, acks failed on the cut session %d", cut, lost, acks)
	t.Logf("traffic: %s", tr)
	return 2*len(ids) + int(tr.created.Load())*2 + int(tr.cancels.Load())
}
