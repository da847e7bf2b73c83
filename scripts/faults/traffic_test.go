//go:build faults

package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
)

// farShare is the share of purchases that end hours after the scenario: at
// quiescence they are Active, so cards carry a non-zero true boost and a
// lost Active event shows on them.
const farShare = 3 // one purchase in farShare

// farEndsAt is an EndsAt hours away.
func farEndsAt() time.Time { return time.Now().Add(2*time.Hour + rand.N(time.Hour)) }

// traffic drives the purchase API like tenant managers would: purchases of
// one to three targets (projects, objects, unpublished objects, posts), one
// in farShare ending in hours and the others within seconds, a share of them
// cancelled, some racing their expiry.
type traffic struct {
	e       *env
	client  *http.Client
	created atomic.Int64
	n       atomic.Int64
	// unavailable counts 503s, each with Retry-After and a JSON error.
	unavailable atomic.Int64
	// serverErrors counts every 5xx answer, 503s included.
	serverErrors atomic.Int64
	// dropped counts requests whose connection failed while their process
	// was deliberately down (and that went to the next process).
	dropped atomic.Int64
	cancels atomic.Int64
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

func (e *env) newTraffic(timeout time.Duration) *traffic {
	return &traffic{e: e, client: &http.Client{Timeout: timeout}, stop: func() {}}
}

// drive starts traffic at about rate purchases per second until stopped.
func (e *env) drive(rate int, cancelShare float64) *traffic {
	ctx, cancel := context.WithCancel(e.ctx)
	tr := e.newTraffic(10 * time.Second)
	tr.stop = cancel
	every := time.Second / time.Duration(rate)
	tr.wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			tr.wg.Go(func() { tr.purchase(ctx, cancelShare) })
		}
	})
	return tr
}

// halt stops the traffic and waits for requests under way, cancels included.
func (tr *traffic) halt() {
	tr.stop()
	tr.wg.Wait()
}

// end halts the traffic, logs what it did, and returns the events it caused
// as the scenarios count them: two per purchase created, one per cancel.
func (tr *traffic) end(t *testing.T) int {
	tr.halt()
	t.Logf("traffic: %s", tr)
	return int(tr.created.Load())*2 + int(tr.cancels.Load())
}

func (tr *traffic) purchase(ctx context.Context, cancelShare float64) {
	e := tr.e
	tn := e.tenants[rand.IntN(len(e.tenants))]
	endsAt := time.Now().Add(time.Second + rand.N(5*time.Second))
	if tr.n.Add(1)%farShare == 0 {
		endsAt = farEndsAt()
	}
	body := map[string]any{"PackageKind": "Top", "BoostWeight": 1 + rand.IntN(100), "Targets": e.randomTargets(),
		"EndsAt": endsAt.UTC().Format(time.RFC3339Nano)}
	status, resp := tr.call(ctx, http.MethodPost, "/promotions", tn.token, body)
	if status != http.StatusCreated {
		return
	}
	if rand.Float64() >= cancelShare {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(rand.N(3 * time.Second)): // some cancels race the expirer
	}
	id, _ := resp["Id"].(string)
	if status, _ := tr.call(context.WithoutCancel(ctx), http.MethodPost, "/promotions/"+id+"/cancel", tn.token, nil); status == http.StatusOK {
		tr.cancels.Add(1)
	}
}

func (e *env) randomTargets() []map[string]string {
	var out []map[string]string
	seen := map[string]bool{}
	for range 1 + rand.IntN(3) {
		kind, id := "Project", e.projects[rand.IntN(len(e.projects))]
		switch rand.IntN(5) {
		case 0, 1:
			kind, id = "PropertyObject", e.objects[rand.IntN(len(e.objects))]
		case 2:
			kind, id = "PropertyObject", e.drafts[rand.IntN(len(e.drafts))]
		case 3:
			if rand.IntN(3) == 0 {
				kind, id = "Post", uuid.New()
			}
		}
		if key := kind + id.String(); !seen[key] {
			seen[key] = true
			out = append(out, map[string]string{"TargetKind": kind, "TargetId": id.String()})
		}
	}
	return out
}

// call sends a request to a promotion process that runs and checks the
// answer's form: never a 5xx other than a 503 with Retry-After, and every
// error as JSON. A failed connection (refused, reset, EOF, timeout) is
// accepted only when its process was deliberately down while the request
// ran; the request then goes to the next process.
func (tr *traffic) call(ctx context.Context, method, path, token string, body any) (int, map[string]any) {
	e := tr.e
	var raw []byte
	if body != nil {
		raw, _ = json.Marshal(body)
	}
	start := rand.IntN(len(e.promotions))
	for i := range len(e.promotions) {
		p := e.promotions[(start+i)%len(e.promotions)]
		req, _ := http.NewRequestWithContext(ctx, method, "http://"+p.addr+path, bytes.NewReader(raw))
		req.Header.Set("Authorization", "Bearer "+token)
		down0, downs0 := p.window()
		resp, err := tr.client.Do(req)
		if err == nil {
			return tr.check(method, path, resp)
		}
		if ctx.Err() != nil {
			return 0, nil
		}
		if down1, downs1 := p.window(); !down0 && !down1 && downs0 == downs1 {
			e.violate("%s %s to %s, which was not deliberately down: %v", method, path, p.name, err)
			return 0, nil
		}
		tr.dropped.Add(1)
	}
	return 0, nil
}

func (tr *traffic) check(method, path string, resp *http.Response) (int, map[string]any) {
	defer resp.Body.Close()
	var out map[string]any
	jsonErr := json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode >= 400 {
		if code, _ := out["code"].(string); jsonErr != nil || code == "" || resp.Header.Get("Content-Type") != "application/problem+json" {
			tr.e.violate("%s %s: %d without a problem details body", method, path, resp.StatusCode)
		}
	}
	isCreate := method == http.MethodPost && path == "/promotions"
	if resp.StatusCode >= 500 {
		tr.serverErrors.Add(1)
	}
	switch {
	case resp.StatusCode == http.StatusServiceUnavailable:
		tr.unavailable.Add(1)
		if resp.Header.Get("Retry-After") == "" {
			tr.e.violate("%s %s: 503 without Retry-After", method, path)
		}
	case resp.StatusCode >= 500:
		tr.e.violate("%s %s: %d %v", method, path, resp.StatusCode, out)
	case isCreate && resp.StatusCode == http.StatusCreated:
		id, err := uuid.Parse(fmt.Sprint(out["Id"]))
		if err != nil {
			tr.e.violate("create: 201 without a purchase id: %v", out)
			break
		}
		tr.e.recordCreated(id)
		tr.created.Add(1)
	case isCreate:
		tr.e.violate("create: %d %v", resp.StatusCode, out)
	}
	return resp.StatusCode, out
}

func (tr *traffic) String() string {
	return fmt.Sprintf("created %d, cancelled %d, 503 answers %d, requests dropped by a process deliberately down %d",
		tr.created.Load(), tr.cancels.Load(), tr.unavailable.Load(), tr.dropped.Load())
}
