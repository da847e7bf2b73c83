//go:build faults

package faults

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/promoflow/promoflow/router/kafkakit"
)

// cancelsRaceExpirer: many purchases end at one instant and each gets a
// manager's cancel right then; one side wins each race, with one terminal
// transition and one terminal event.
func cancelsRaceExpirer(t *testing.T, e *env) int {
	ids, endsAt := e.burst(size(300, 1000), 100)
	time.Sleep(time.Until(endsAt.Add(-200 * time.Millisecond)))
	tr := &traffic{e: e, client: &http.Client{Timeout: 30 * time.Second}}
	var ok, conflict atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for id, token := range ids {
		wg.Go(func() {
			<-start
			// Spread over the expirer's next cycle, so that both sides win some.
			time.Sleep(mrand.N(2400 * time.Millisecond))
			switch status, _ := tr.call(e.ctx, http.MethodPost, "/promotions/"+id+"/cancel", token, nil); status {
			case http.StatusOK:
				ok.Add(1)
			case http.StatusConflict:
				conflict.Add(1)
			default:
				e.violate("cancel %s: %d", id, status)
			}
		})
	}
	close(start)
	wg.Wait()
	e.fault()
	e.waitExpired(time.Minute)
	var cancelled int64
	must(t, e.db.Get(&cancelled, `SELECT count(*) FROM promotion.promotion_purchases WHERE status = 'Cancelled'`))
	if cancelled != ok.Load() {
		e.violate("%d cancels answered 200, %d purchases are Cancelled", ok.Load(), cancelled)
	}
	t.Logf("%d cancels won, %d lost to the expirer", ok.Load(), conflict.Load())
	return 2 * len(ids)
}

// rebuildUnderLoad: a projection rebuild started on one catalog process while
// traffic goes on; the other process reports its progress, and the cards end
// equal to the promotion truth.
func rebuildUnderLoad(t *testing.T, e *env) int {
	tr := e.drive(100, 0.2)
	time.Sleep(3 * time.Second)
	if code := e.adminCall("POST", e.catalogs[0], "/admin/projections/rebuild", nil); code != http.StatusAccepted {
		e.violate("rebuild answered %d", code)
	}
	e.fault()
	var state string
	if _, ok := eventually(e.ctx, 2*time.Minute, func() bool {
		var st map[string]any
		e.adminCall("GET", e.catalogs[1], "/admin/projections/rebuild", &st)
		state, _ = st["state"].(string)
		return state == "done" || state == "failed"
	}); !ok || state != "done" {
		e.violate("rebuild state %q, want done", state)
	}
	time.Sleep(2 * time.Second)
	tr.halt()
	t.Logf("traffic: %s", tr)
	return int(tr.created.Load())*2 + int(tr.cancels.Load())
}

func (e *env) adminCall(method string, p *proc, path string, into any) int {
	req, _ := http.NewRequest(method, "http://"+p.addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+e.admin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if into != nil {
		_ = json.NewDecoder(resp.Body).Decode(into)
	}
	return resp.StatusCode
}

// cardBoosts is every card's boost.
func (e *env) cardBoosts(t *testing.T) map[uuid.UUID]int {
	var rows []struct {
		ID    uuid.UUID `db:"id"`
		Boost int       `db:"promotion_boost"`
	}
	must(t, e.db.Select(&rows, `SELECT id, promotion_boost FROM catalog.project_cards
		UNION ALL SELECT id, promotion_boost FROM catalog.property_object_cards`))
	out := map[uuid.UUID]int{}
	for _, r := range rows {
		out[r.ID] = r.Boost
	}
	return out
}

// metric sums the samples of a metric family a process exposes.
func metric(p *proc, name string) float64 {
	resp, err := http.Get("http://" + p.addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
			f, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			sum += f
		}
	}
	return sum
}

// malformedRecords: random and malformed records on the purchase topic. Each
// is dead-lettered or a counted no-op; nothing crashes and no card changes.
func malformedRecords(t *testing.T, e *env) int {
	tr := e.drive(100, 0.2)
	time.Sleep(2 * time.Second)
	tr.halt()
	e.quiesce(time.Minute)
	before := e.cardBoosts(t)
	cat := e.catalogs[0]
	handled := func() float64 {
		return metric(cat, "catalog_promotion_dlq_total") + metric(cat, "catalog_promotion_consumed_total")
	}
	base := handled()

	n := size(1000, 10000)
	producer, err := sarama.NewSyncProducer([]string{e.s.brokers}, kafkakit.Cluster{Brokers: []string{e.s.brokers}}.DurableProducerConfig("faults"))
	must(t, err)
	defer producer.Close()
	var batch []*sarama.ProducerMessage
	for i := range n {
		batch = append(batch, randomRecord(e.topic, i))
		if len(batch) == 500 || i == n-1 {
			must(t, producer.SendMessages(batch))
			batch = batch[:0]
		}
	}
	e.fault()
	if _, ok := eventually(e.ctx, 3*time.Minute, func() bool { return handled()-base >= float64(n) }); !ok {
		e.violate("%v of %d bad records were dead-lettered or counted", handled()-base, n)
	}
	e.expectAlert("CatalogPromotionDeadLetters", true, 30*time.Second)
	if after := e.cardBoosts(t); !equalBoosts(before, after) {
		e.violate("bad records changed card boosts")
	}
	e.expectAlert("CatalogPromotionDeadLetters", false, 90*time.Second)
	t.Logf("traffic: %s; %d bad records, DLQ %v", tr, n, metric(cat, "catalog_promotion_dlq_total"))
	return n
}

func equalBoosts(a, b map[uuid.UUID]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// randomRecord is one of: random bytes, random JSON, an event that breaks the
// contract, or a valid Post-only event (a no-op); with or without headers.
func randomRecord(topic string, i int) *sarama.ProducerMessage {
	msg := &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(uuid.NewString())}
	pid := uuid.NewString()
	switch i % 5 {
	case 0:
		b := make([]byte, mrand.IntN(200))
		_, _ = rand.Read(b)
		msg.Value = sarama.ByteEncoder(b)
	case 1:
		msg.Value = sarama.StringEncoder(fmt.Sprintf(`{"x%d":[%d,{"PurchaseId":%q}],"Version":"seven"}`, i, i, pid))
	case 2:
		msg.Value = sarama.StringEncoder(fmt.Sprintf(`{"PurchaseId":%q,"Version":%d,"BoostWeight":%d,"Status":"Frozen","Targets":[]}`,
			pid, -i, 100+i))
	case 3: // keyed by its PurchaseId, as the contract wants
		msg.Key = sarama.StringEncoder(pid)
		msg.Value = sarama.StringEncoder(fmt.Sprintf(`{"PurchaseId":%q,"TenantId":%q,"PackageKind":"Top","BoostWeight":5,
			"Status":"Active","PaymentStatus":"NotRequired","StartsAt":"2026-01-01T00:00:00Z","EndsAt":"2026-02-01T00:00:00Z",
			"Version":1,"Targets":[{"TargetKind":"Post","TargetId":%q}]}`, pid, uuid.NewString(), uuid.NewString()))
	case 4:
		msg.Value = sarama.StringEncoder(fmt.Sprintf(`{"PurchaseId":%q,"Version":1,"BoostWeight":0,"Status":"Active",
			"Targets":[{"TargetKind":"Project","TargetId":"00000000-0000-0000-0000-000000000000"}]}`, pid))
	}
	if i%2 == 0 || i%5 == 3 {
		msg.Headers = []sarama.RecordHeader{{Key: []byte("_watermill_message_uuid"), Value: []byte(uuid.NewString())},
			{Key: []byte("contract_version"), Value: []byte(strconv.Itoa(i % 3))}}
	}
	return msg
}

// malformedRequests: bad HTTP requests of every kind to both APIs. Each gets
// a 4xx problem details answer (application/problem+json) and no row is written.
func malformedRequests(t *testing.T, e *env) int {
	rows := func() (n int64) {
		must(t, e.db.Get(&n, `SELECT (SELECT count(*) FROM promotion.promotion_purchases) + (SELECT count(*) FROM promotion.idempotency_keys)
			+ (SELECT count(*) FROM promotion.outbox_messages) + (SELECT count(*) FROM catalog.project_cards)
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
