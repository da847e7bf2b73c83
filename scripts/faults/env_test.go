//go:build faults

package faults

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq"

	"github.com/promoflow/promoflow/handlers/nettest"
)

// env is one scenario's world: a database, topics and consumer group of its
// own, its processes, tenants and cards.
type env struct {
	s     *suite
	t     *testing.T
	ctx   context.Context
	dbURL string
	db    *sqlx.DB
	// dbName is the scenario's database on its server.
	dbName string

	topic, dlq, replay, group string
	tenants                   []tenant
	admin                     string
	promotions, catalogs      []*proc
	projects, objects, drafts []uuid.UUID

	// kafkaProxies carry the Kafka traffic of the processes a scenario
	// names in kafkaVia (one proxy per broker); pgProxy their PostgreSQL
	// traffic (pgVia).
	kafkaProxies    []*nettest.Proxy
	pgProxy         *nettest.Proxy
	kafkaVia, pgVia map[string]bool
	// pair is the scenario's own primary and standby (scenario.replicated),
	// nil on the stack's server.
	pair *pgPair

	// started is when the scenario's processes were started: the window of
	// its Prometheus checks begins there.
	started time.Time

	mu         sync.Mutex
	violations []string
	faults     int
	// detail is what the scenario measured besides, for its line.
	detail string
	// created are the purchase ids the API answered 201 for, with when
	// the answer came (after the purchase's commit).
	created  map[uuid.UUID]bool
	answered map[uuid.UUID]time.Time
	// retired are the processes a scenario stopped for good: finish reads
	// their logs too.
	retired []*proc
	// malformed are the keys of the records a scenario wrote to break the
	// contract on purpose: the checker leaves out those records, and only those.
	malformed map[string]bool
	// lost and reconciled: the checker's evidence of the same names.
	lost, reconciled map[uuid.UUID]bool
	// phantomFrom and phantomTo bound, per partition, the offsets of the
	// records whose MessageIds are the checker's phantoms (nil: none).
	phantomFrom, phantomTo map[int32]int64
	// promotionFlags: the scenario's.
	promotionFlags []string
}

type tenant struct {
	token string
	id    uuid.UUID
}

func suffix() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newEnv makes the scenario's database, proxies and processes and the
// chessboard's cards: 3 projects of 8 published and 2 unpublished objects.
func newEnv(t *testing.T, s *suite, sc scenario) *env {
	t.Helper()
	sfx := suffix()
	e := &env{s: s, t: t, ctx: context.Background(), admin: "catalog-admin-token-" + sfx, created: map[uuid.UUID]bool{}, answered: map[uuid.UUID]time.Time{}, malformed: map[string]bool{},
		lost: map[uuid.UUID]bool{}, reconciled: map[uuid.UUID]bool{}, promotionFlags: sc.promotionFlags,
		kafkaVia: set(sc.kafkaVia), pgVia: set(sc.pgVia),
		topic: "pin.promotion.purchase-changed.faults-" + sfx, dlq: "pin.catalog.promotion-boost-dlq.faults-" + sfx,
		replay: "pin.catalog.promotion-boost-replay.faults-" + sfx, group: "pin-catalog-promotion-boost-faults-" + sfx}
	name := "faults_" + sfx
	e.dbName = name
	base := s.dbBase
	if sc.replicated != "" {
		e.pair = startPair(t, sc.replicated)
		base = e.pair.primary.URL("sslmode=disable")
	}
	admin, err := sqlx.Open("postgres", base)
	must(t, err)
	defer admin.Close()
	_, err = admin.Exec(`CREATE DATABASE ` + name)
	must(t, err)
	u, err := url.Parse(base)
	must(t, err)
	u.Path = "/" + name
	e.dbURL = u.String()
	if e.pair != nil && len(e.pgVia) == 0 {
		e.dbURL = e.pair.dsn(name)
	}
	e.db, err = sqlx.Open("postgres", e.dbURL)
	must(t, err)
	e.db.SetMaxOpenConns(10)
	t.Cleanup(func() {
		e.stopAll()
		for _, p := range e.proxies() {
			p.Close()
		}
		e.db.Close()
		if !t.Failed() && e.pair == nil {
			if a, err := sqlx.Open("postgres", s.dbBase); err == nil {
				_, _ = a.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`)
				a.Close()
			}
			// Fewer partitions on the brokers: a broker killed with -9
			// recovers every partition it holds before it serves again.
			if a, err := s.admin(); err == nil {
				for _, topic := range []string{e.topic, e.dlq, e.replay} {
					_ = a.DeleteTopic(topic)
				}
				a.Close()
			}
		}
	})
	for i := range 3 {
		e.tenants = append(e.tenants, tenant{token: fmt.Sprintf("tenant-token-%d-%s", i, sfx), id: uuid.New()})
	}
	e.startProxies(u)
	if e.pair != nil && e.pgProxy != nil {
		// The checker, too, reaches the database at the address the
		// scenario moves.
		e.dbURL = e.dbFor("*")
		e.db.Close()
		e.db, err = sqlx.Open("postgres", e.dbURL)
		must(t, err)
		e.db.SetMaxOpenConns(10)
	}
	for i := range sc.promotions {
		e.promotions = append(e.promotions, e.newProc("promotion", i+1))
	}
	for i := range sc.catalogs {
		e.catalogs = append(e.catalogs, e.newProc("catalog", i+1))
	}
	// A scenario that starts from the previous release starts on its schema:
	// the head's migrations come later, as a step of the scenario.
	bin := s.bin
	if sc.previous {
		bin = s.previous(t).bin
		for _, p := range e.all() {
			p.asPrevious(bin)
		}
	}
	migrateUp(t, bin, e.dbURL)
	e.started = time.Now()
	// One process first: it creates the topics.
	e.promotions[0].start(t)
	for _, p := range e.all()[1:] {
		p.start(t)
	}
	s.prom.scrape(t, e.all())
	e.seedCards()
	return e
}

// newProc makes the scenario's process job-n, whose exits nobody caused
// are violations.
func (e *env) newProc(job string, n int) *proc {
	args := e.catalogArgs
	if job == "promotion" {
		args = e.promotionArgs
	}
	p := newProc(e.t, e.s, job, n, args)
	p.unexpected = func(p *proc, x exitRecord) { e.violate("%s exited: %s (log %s)", p.name, x, p.logs) }
	return p
}

func (e *env) promotionArgs(name string) []string {
	tokens := make([]string, len(e.tenants))
	for i, tn := range e.tenants {
		tokens[i] = tn.token + "=" + tn.id.String()
	}
	return append([]string{"--database-url", e.dbFor(name), "--kafka-brokers", e.kafkaFor(name), "--topic", e.topic,
		// The production schedule (60s interval, 30s most per cycle) at the alert rules' time scale.
		"--expire-interval", "2s", "--expire-max-duration", "1s", "--api-tokens", strings.Join(tokens, ","), "--log-level", "warn"},
		e.promotionFlags...)
}

func (e *env) catalogArgs(name string) []string {
	return []string{"--database-url", e.dbFor(name), "--kafka-brokers", e.kafkaFor(name), "--topic", e.topic, "--dlq-topic", e.dlq,
		"--replay-topic", e.replay, "--consumer-group", e.group, "--admin-token", e.admin, "--feed-token", "feed-" + e.admin,
		"--audit-interval", "2s", "--log-level", "warn"}
}

func (e *env) all() []*proc { return append(append([]*proc{}, e.promotions...), e.catalogs...) }

func (e *env) stopAll() {
	var wg sync.WaitGroup
	for _, p := range e.all() {
		wg.Go(p.stop)
	}
	wg.Wait()
}

// violate records a broken invariant.
func (e *env) violate(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.violations = append(e.violations, fmt.Sprintf(format, args...))
}

// recordCreated keeps an id the API answered 201 for.
func (e *env) recordCreated(id uuid.UUID) {
	e.mu.Lock()
	e.created[id] = true
	e.answered[id] = time.Now()
	e.mu.Unlock()
}

// markMalformed keeps the key of a record written to break the contract.
func (e *env) markMalformed(key string) {
	e.mu.Lock()
	e.malformed[key] = true
	e.mu.Unlock()
}

func (e *env) fault() {
	e.mu.Lock()
	e.faults++
	e.mu.Unlock()
}

// seedCards feeds the cards through the catalog's admin API.
func (e *env) seedCards() {
	for range 3 {
		p := uuid.New()
		e.projects = append(e.projects, p)
		e.put("/cards/projects/"+p.String(), map[string]any{"Title": "P", "Status": "Published", "Visibility": "Visible"})
		for i := range 10 {
			o := uuid.New()
			e.put("/cards/property-objects/"+o.String(), map[string]any{"ProjectId": p, "Published": i < 8, "Status": "OnSale"})
			if i < 8 {
				e.objects = append(e.objects, o)
			} else {
				e.drafts = append(e.drafts, o)
			}
		}
	}
}

func (e *env) put(path string, body any) {
	raw, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPut, "http://"+e.catalogs[0].addr+path, bytes.NewReader(raw))
	token := "feed-" + e.admin
	if e.catalogs[0].previous {
		token = e.admin
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("card feed: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("card feed %s: %d", path, resp.StatusCode)
	}
}

// waitReady waits until every process that runs answers /readyz with 200.
func (e *env) waitReady(timeout time.Duration) bool {
	_, ok := eventually(e.ctx, timeout, func() bool {
		for _, p := range e.all() {
			if p.alive() && p.ready() != http.StatusOK {
				return false
			}
		}
		return true
	})
	return ok
}
