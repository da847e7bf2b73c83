//go:build faults

package faults

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/google/uuid"
)

// cancelsRaceExpirer: a burst of purchases ends at one instant (half as
// many more end in hours) and each gets a manager's cancel, spread over
// 2.4 s from 200 ms before that instant (the processes run with
// EXPIRE_INTERVAL 2s and the wake-up at the earliest EndsAt). Each race has
// one winner, as the API said: a cancel answered 200 left its purchase
// Cancelled, one answered 409 left it Expired, and no other answer comes;
// both sides win some; the checker finds each purchase with exactly one
// terminal event.
func cancelsRaceExpirer(t *testing.T, e *env) int {
	ids, endsAt := e.burst(size(300, 1000), 100)
	time.Sleep(time.Until(endsAt.Add(-200 * time.Millisecond)))
	tr := e.newTraffic(30 * time.Second)
	var mu sync.Mutex
	answers := map[int]map[string]string{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for id, token := range ids {
		wg.Go(func() {
			<-start
			time.Sleep(mrand.N(2400 * time.Millisecond)) // spread over the expirer's next cycle
			status, _ := tr.call(e.ctx, http.MethodPost, "/promotions/"+id+"/cancel", token, nil)
			mu.Lock()
			if answers[status] == nil {
				answers[status] = map[string]string{}
			}
			answers[status][id] = token
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	e.fault()
	e.waitExpired(time.Minute)
	won, lost := answers[http.StatusOK], answers[http.StatusConflict]
	for status, got := range answers {
		if status != http.StatusOK && status != http.StatusConflict {
			e.violate("%d cancels answered %d", len(got), status)
		}
	}
	e.wantStatus(won, "Cancelled", len(won))
	e.wantStatus(lost, "Expired", len(lost))
	if len(won) == 0 || len(lost) == 0 {
		e.violate("one side won every race: %d cancels won, %d lost to the expirer", len(won), len(lost))
	}
	t.Logf("%d cancels won, %d lost to the expirer", len(won), len(lost))
	return 2 * len(ids)
}

// rebuildUnderLoad: a projection rebuild is started on one catalog process
// (202) while traffic creates purchases before, during and after it; the
// other catalog process reports it done within 2 minutes; at quiescence the
// cards equal the promotion truth (the checker).
func rebuildUnderLoad(t *testing.T, e *env) int {
	tr := e.drive(100, 0.2)
	tr.waitCreated(200, 30*time.Second, "before the rebuild")
	if code := e.adminCall("POST", e.catalogs[0], "/admin/projections/rebuild", nil); code != http.StatusAccepted {
		e.violate("rebuild answered %d", code)
	}
	e.fault()
	during := tr.created.Load()
	var state string
	if _, ok := eventually(e.ctx, 2*time.Minute, func() bool {
		var st map[string]any
		e.adminCall("GET", e.catalogs[1], "/admin/projections/rebuild", &st)
		state, _ = st["state"].(string)
		return state == "done" || state == "failed"
	}); !ok || state != "done" {
		e.violate("rebuild state %q, want done", state)
	}
	if during = tr.created.Load() - during; during == 0 {
		e.violate("no purchase was created while the rebuild ran")
	}
	tr.waitCreated(100, 30*time.Second, "after the rebuild")
	tr.halt()
	t.Logf("traffic: %s; %d purchases created while the rebuild ran", tr, during)
	return int(tr.created.Load())*2 + int(tr.cancels.Load())
}

func (e *env) adminCall(method string, p *proc, path string, into any) int {
	req, _ := http.NewRequest(method, "http://"+p.internal+path, nil)
	req.Header.Set("Authorization", "Bearer "+e.admin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.violate("%s %s on %s: %v", method, path, p.name, err)
		return 0
	}
	defer resp.Body.Close()
	if into != nil {
		_ = json.NewDecoder(resp.Body).Decode(into)
	}
	return resp.StatusCode
}

// malformedRecords: traffic runs, stops, and every purchase that ends within
// seconds ends, so that nothing else reaches the consumer. Then random and
// malformed records go onto the purchase topic, the contract-breaking ones
// naming seeded cards with weights that would change them if applied. Each
// contract-breaking record is dead-lettered once (its key once in the DLQ,
// no other key there, catalog_promotion_dlq_total up by exactly their
// number); each valid Post-only one is a counted no-op
// (catalog_promotion_consumed_total{outcome="post_only"} up by exactly
// their number); CatalogPromotionDeadLetters fires, then resolves; no card's
// boost changes. Their keys, marked as sent, are the only records the
// checker leaves out.
func malformedRecords(t *testing.T, e *env) int {
	tr := e.drive(100, 0.2)
	tr.waitCreated(200, 30*time.Second, "before the bad records")
	tr.halt()
	var soon int
	if _, ok := eventually(e.ctx, time.Minute, func() bool {
		return e.db.Get(&soon, `SELECT count(*) FROM promotion.promotion_purchases
			WHERE status = 'Active' AND ends_at < now() + interval '1 hour'`) == nil && soon == 0
	}); !ok {
		e.violate("%d purchases that end within the hour are still Active", soon)
	}
	e.quiesce(time.Minute)
	boosts := func() map[uuid.UUID]int {
		cards, err := readCards(e.ctx, e.db)
		must(t, err)
		out := map[uuid.UUID]int{}
		for _, c := range cards {
			out[c.ID] = c.Have
		}
		return out
	}
	before := boosts()
	cat := e.catalogs[0]
	const postOnly = `catalog_promotion_consumed_total{outcome="post_only"}`
	dlq0, err1 := metric(cat, "catalog_promotion_dlq_total")
	post0, err2 := metric(cat, postOnly)
	must(t, errors.Join(err1, err2))

	n := size(1000, 10000)
	producer, err := sarama.NewSyncProducer(e.s.cluster().Brokers, e.s.cluster().DurableProducerConfig("faults"))
	must(t, err)
	defer producer.Close()
	bad := map[string]bool{}
	posts := 0
	var batch []*sarama.ProducerMessage
	for i := range n {
		msg, valid := e.randomRecord(i)
		key := string(msg.Key.(sarama.StringEncoder))
		e.markMalformed(key)
		if valid {
			posts++
		} else {
			bad[key] = true
		}
		batch = append(batch, msg)
		if len(batch) == 500 || i == n-1 {
			must(t, producer.SendMessages(batch))
			batch = batch[:0]
		}
	}
	e.fault()

	var dead map[string]int
	var dlq, post float64
	if _, ok := eventually(e.ctx, 3*time.Minute, func() bool {
		var recs []topicRecord
		if _, recs, err = readTopic(e.ctx, e.s.cluster(), e.dlq); err != nil {
			return false
		}
		dead = map[string]int{}
		for _, r := range recs {
			dead[r.Key]++
		}
		if post, err = metric(cat, postOnly); err != nil {
			return false
		}
		return len(dead) >= len(bad) && post-post0 >= float64(posts)
	}); !ok {
		e.violate("%d of %d contract-breaking records in the DLQ, %v of %d Post-only ones counted (%v)",
			len(dead), len(bad), post-post0, posts, err)
	}
	for key, times := range dead {
		switch {
		case !bad[key]:
			e.violate("DLQ record with key %s, which is not one of the bad records sent", key)
		case times != 1:
			e.violate("bad record %s dead-lettered %d times", key, times)
		}
	}
	for key := range bad {
		if dead[key] == 0 {
			e.violate("bad record %s is not in the DLQ", key)
		}
	}
	if dlq, err = metric(cat, "catalog_promotion_dlq_total"); err != nil || dlq-dlq0 != float64(len(bad)) {
		e.violate("catalog_promotion_dlq_total rose by %v, want %d (%v)", dlq-dlq0, len(bad), err)
	}
	if post-post0 != float64(posts) {
		e.violate("%s rose by %v, want %d", postOnly, post-post0, posts)
	}
	e.expectAlert("CatalogPromotionDeadLetters", true, 30*time.Second)
	if after := boosts(); !maps.Equal(before, after) {
		e.violate("bad records changed card boosts")
	}
	e.expectAlert("CatalogPromotionDeadLetters", false, 90*time.Second)
	t.Logf("traffic: %s; %d bad records, %d Post-only ones", tr, len(bad), posts)
	return n
}

// randomRecord is the i-th record for the purchase topic: random bytes,
// random JSON, an event that breaks the contract in one way while naming
// seeded cards with a weight (a Status out of the enum, a weight over 100,
// Version 0, an unknown target kind, no PurchaseId), or a valid Post-only
// event (valid true), with or without headers. Each has a key of its own.
func (e *env) randomRecord(i int) (*sarama.ProducerMessage, bool) {
	pid, tenant := uuid.NewString(), uuid.NewString()
	project, object := e.projects[i%len(e.projects)], e.objects[i%len(e.objects)]
	msg := &sarama.ProducerMessage{Topic: e.topic, Key: sarama.StringEncoder(pid)}
	event := func(status string, weight, version int, purchase string, targets string) sarama.Encoder {
		return sarama.StringEncoder(fmt.Sprintf(`{"PurchaseId":%q,"TenantId":%q,"PackageKind":"Top","BoostWeight":%d,
			"Status":%q,"PaymentStatus":"NotRequired","StartsAt":"2025-01-01T00:00:00Z","EndsAt":"2999-01-01T00:00:00Z",
			"Version":%d,"Targets":[%s]}`, purchase, tenant, weight, status, version, targets))
	}
	target := func(kind string, id uuid.UUID) string {
		return fmt.Sprintf(`{"TargetKind":%q,"TargetId":%q}`, kind, id)
	}
	valid := false
	switch i % 8 {
	case 0:
		// At least one byte: an empty value is a tombstone, which the
		// consumer counts and skips instead of dead-lettering.
		b := make([]byte, 1+mrand.IntN(199))
		_, _ = rand.Read(b)
		msg.Value = sarama.ByteEncoder(b)
	case 1:
		msg.Value = sarama.StringEncoder(fmt.Sprintf(`{"x%d":[%d,{"PurchaseId":%q}],"Version":"seven"}`, i, i, pid))
	case 2:
		msg.Value = event("Frozen", 50, 1, pid, target("Project", project)+","+target("PropertyObject", object))
	case 3:
		msg.Value, valid = event("Active", 5, 1, pid, target("Post", uuid.New())), true
	case 4:
		msg.Value = event("Active", 101, 1, pid, target("PropertyObject", object))
	case 5:
		msg.Value = event("Active", 30, 0, pid, target("Project", project))
	case 6:
		msg.Value = event("Active", 20, 1, pid, target("Project", project)+","+target("Shop", object))
	case 7:
		msg.Value = event("Active", 40, 1, uuid.Nil.String(), target("PropertyObject", object))
	}
	if i%2 == 0 || valid {
		// A valid record needs a MessageId of its own: the consumer's dedup key.
		msg.Headers = []sarama.RecordHeader{{Key: []byte(kafka.UUIDHeaderKey), Value: []byte(uuid.NewString())},
			{Key: []byte("contract_version"), Value: []byte(strconv.Itoa(i % 3))}}
	}
	return msg, valid
}

// malformedRequests: 30 purchases that end in hours are created (so cards
// carry a boost) and consumed; then bad HTTP requests of every kind go to
// both APIs. Each gets a 4xx problem details answer
// (application/problem+json) with a code, and nothing is
// written: purchases, idempotency keys, outbox rows (the outbox's sequence,
// since the janitor deletes relayed rows), cards and contributions keep
// their counts.
func malformedRequests(t *testing.T, e *env) int {
	e.createMany(30, 4, func(int) time.Time { return farEndsAt() })
	e.quiesce(time.Minute)
	rows := func() (n int64) {
		must(t, e.db.Get(&n, `SELECT (SELECT count(*) FROM promotion.promotion_purchases) + (SELECT count(*) FROM promotion.idempotency_keys)
			+ (SELECT last_value FROM promotion.outbox_messages_offset_seq) + (SELECT count(*) FROM catalog.project_cards)
			+ (SELECT count(*) FROM catalog.property_object_cards) + (SELECT count(*) FROM catalog.promotion_contributions)`))
		return n
	}
	before := rows()
	n := size(1000, 10000)
	client := &http.Client{Timeout: 10 * time.Second}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1)); i <= n; i = int(next.Add(1)) {
				req := e.badRequest(i)
				resp, err := client.Do(req)
				if err != nil {
					e.violate("%s %s: %v", req.Method, req.URL.Path, err)
					continue
				}
				var body struct {
					Status int
					Code   string
				}
				jsonErr := json.NewDecoder(resp.Body).Decode(&body)
				resp.Body.Close()
				if resp.StatusCode < 400 || resp.StatusCode >= 500 || jsonErr != nil || body.Code == "" ||
					body.Status != resp.StatusCode || resp.Header.Get("Content-Type") != "application/problem+json" {
					e.violate("%s %s: %d (problem details %+v, %v)", req.Method, req.URL.Path, resp.StatusCode, body, jsonErr)
				}
			}
		})
	}
	wg.Wait()
	e.fault()
	if after := rows(); after != before {
		e.violate("bad requests wrote %d rows", after-before)
	}
	return n
}

// badRequest is the i-th malformed request: a missing or wrong token, a bad
// id, an unknown route or method, or a body that is not a valid purchase or card.
func (e *env) badRequest(i int) *http.Request {
	promotion, catalog := "http://"+e.promotions[0].addr, "http://"+e.catalogs[0].addr
	token := e.tenants[i%len(e.tenants)].token
	junk := make([]byte, mrand.IntN(300))
	_, _ = rand.Read(junk)
	bodies := [][]byte{junk, []byte(`{"BoostWeight":"ten"}`), []byte(`{"Targets":[{"TargetKind":"Shop"}],"BoostWeight":500}`),
		[]byte(`[1,2,3]`), []byte(`{"PackageKind":"Top","BoostWeight":10,"Targets":[],"EndsAt":"yesterday"}`),
		bytes.Repeat([]byte("x"), 70<<10), nil}
	body := bodies[i%len(bodies)]
	var method, url, auth string
	switch i % 9 {
	case 0:
		method, url = "POST", promotion+"/promotions" // no token
	case 1:
		method, url, auth = "POST", promotion+"/promotions", "wrong-token"
	case 2:
		method, url, auth = "POST", promotion+"/promotions", token
	case 3:
		method, url, auth = "GET", promotion+"/promotions/not-a-uuid", token
	case 4:
		method, url, auth = "POST", promotion+"/promotions/"+uuid.NewString()+"/cancel", token
	case 5:
		method, url, auth = []string{"DELETE", "PATCH", "PUT"}[i%3], promotion+"/promotions", token
	case 6:
		method, url, auth = "GET", promotion+"/no/such/route/"+strconv.Itoa(i), token
	case 7:
		method, url, auth = "PUT", catalog+"/cards/projects/"+uuid.NewString(), e.admin
	case 8:
		method, url, auth = "PUT", catalog+"/cards/property-objects/"+uuid.NewString(), []string{"", "nope", e.admin}[i%3]
	}
	if i%9 == 7 && len(body) == 0 {
		body = []byte("{")
	}
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	return req
}
