package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// traffic is clients that create purchases on the purchase API until
// stopped, and what the API answered them.
type traffic struct {
	mu      sync.Mutex
	answers map[int]int // status → count
	ids     []uuid.UUID // purchases answered 201
	bad     []string    // answers that break the API's contract under faults
}

// run starts clients that each create purchases on random projects (a third
// of them ending within two seconds, for the expirer) until stop is called.
func (tr *traffic) run(addr string, projects []uuid.UUID, clients int) (stop func()) {
	tr.answers = map[int]int{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				lasts := time.Hour
				if rand.IntN(3) == 0 {
					lasts = 2 * time.Second
				}
				a, err := postPurchase(addr, pooledToken, projects[rand.IntN(len(projects))], 1+rand.IntN(10), lasts)
				tr.record(a, err)
			}
		})
	}
	var once sync.Once
	return func() { once.Do(func() { cancel(); wg.Wait() }) }
}

func (tr *traffic) record(a purchaseAnswer, err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	switch {
	case err != nil:
		tr.bad = append(tr.bad, "transport: "+err.Error())
	case a.Status == http.StatusCreated:
		tr.ids = append(tr.ids, a.ID)
	case a.Status == http.StatusServiceUnavailable && a.RetryAfter != "":
	default:
		tr.bad = append(tr.bad, fmt.Sprintf("%d (Retry-After %q): %s", a.Status, a.RetryAfter, a.Body))
	}
	if err == nil {
		tr.answers[a.Status]++
	}
}

// waitFor waits until n answers of status have arrived.
func (tr *traffic) waitFor(t *testing.T, status, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return tr.count(status) >= n }, 60*time.Second, 20*time.Millisecond,
		"%d answers %d", n, status)
}

func (tr *traffic) count(status int) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.answers[status]
}

func (tr *traffic) counts() map[int]int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := make(map[int]int, len(tr.answers))
	for k, v := range tr.answers {
		out[k] = v
	}
	return out
}

func (tr *traffic) wrong() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.bad...)
}

func (tr *traffic) created() []uuid.UUID {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]uuid.UUID(nil), tr.ids...)
}

// projectTruthSQL lists the project cards whose boost is not the sum of the
// weights of the Active purchases that target them, as promotion's own table says.
const projectTruthSQL = `SELECT c.id FROM catalog.project_cards c
	LEFT JOIN (SELECT (t->>'TargetId')::uuid AS id, sum(p.boost_weight)::int AS s
		FROM promotion.promotion_purchases p, jsonb_array_elements(p.targets) t
		WHERE p.status = 'Active' AND t->>'TargetKind' = 'Project' GROUP BY 1) a ON a.id = c.id
	WHERE c.promotion_boost <> coalesce(a.s, 0)`
