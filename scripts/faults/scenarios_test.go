//go:build faults

package faults

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// scenario is one fault and what must hold after it.
type scenario struct {
	num  int
	name string
	run  func(t *testing.T, e *env) (events int)
	// promotions and catalogs are how many processes of each it runs.
	promotions, catalogs int
	// full marks a scenario that only the full form runs.
	full bool
	// kafkaVia and pgVia name the processes ("promotion-1", "*" for all)
	// whose Kafka or PostgreSQL traffic goes through the env's proxies.
	kafkaVia, pgVia []string
	// replicated gives the scenario a PostgreSQL primary and standby of its
	// own instead of the stack's server (replicated_test.go).
	replicated replication
	// promotionFlags are more command-line flags of the promotion processes.
	promotionFlags []string
	// previous starts the scenario's processes from the previous release
	// (release_test.go) instead of the binary under test.
	previous bool
	// test names the scenario's subtest instead of its number.
	test string
}

var scenarios = []scenario{
	{num: 1, name: "three expirers racing", run: threeExpirers, promotions: 3, catalogs: 1},
	{num: 2, name: "kill -9 promotion mid expirer batch", run: killMidBatch, promotions: 2, catalogs: 1},
	{num: 3, name: "kill -9 relay holder mid relay", run: killRelayHolder, promotions: 2, catalogs: 1},
	{num: 4, name: "kill -9 catalog mid message", run: killCatalog, promotions: 1, catalogs: 1},
	{num: 5, name: "Kafka cluster restart under load", run: restartKafka, promotions: 2, catalogs: 2},
	{num: 6, name: "PostgreSQL restart under load", run: restartPostgres, promotions: 2, catalogs: 2},
	{num: 7, name: "concurrent cancels racing the expirer", run: cancelsRaceExpirer, promotions: 2, catalogs: 1},
	{num: 8, name: "projection rebuild under load", run: rebuildUnderLoad, promotions: 1, catalogs: 2},
	{num: 9, name: "malformed records on the topic", run: malformedRecords, promotions: 1, catalogs: 1},
	{num: 10, name: "malformed HTTP requests", run: malformedRequests, promotions: 1, catalogs: 1},
	{num: 11, name: "(a) kill -9 leader of most partitions", run: killLeader, promotions: 2, catalogs: 2},
	{num: 12, name: "(b) one broker down for 60s", run: brokerDown, promotions: 2, catalogs: 2, full: true},
	{num: 13, name: "(c) two brokers down: NOT_ENOUGH_REPLICAS", run: twoBrokersDown, promotions: 2, catalogs: 2, full: true},
	{num: 14, name: "(d) kill -9 active controller", run: killController, promotions: 2, catalogs: 2, full: true},
	{num: 15, name: "(e) kill -9 coordinator mid-rebalance", run: killCoordinatorMidRebalance, promotions: 2, catalogs: 2, full: true},
	{num: 16, name: "(f) relay holder cut off from Kafka", run: cutRelayHolder, promotions: 2, catalogs: 1,
		kafkaVia: []string{"promotion-1"}},
	{num: 17, name: "(g) catalog cut off from PostgreSQL", run: catalogCutFromPostgres, promotions: 1, catalogs: 2, full: true,
		pgVia: []string{"catalog-1"}},
	{num: 18, name: "(h) 200ms on every Kafka connection", run: kafkaLatency, promotions: 2, catalogs: 2, full: true,
		kafkaVia: []string{"*"}},
	{num: 19, name: "(i) a foreign writer holds an xid for 2 minutes", run: foreignWriter, promotions: 2, catalogs: 1},
	{num: 20, name: "(j) the relay holder's PostgreSQL session is killed mid-page", run: killRelaySession, promotions: 2, catalogs: 1},
	{num: 21, name: "(k) PostgreSQL crash under load (immediate shutdown, crash recovery)", run: crashPostgres, promotions: 2, catalogs: 2},
	{num: 22, name: "(l, p) asynchronous failover with the standby flush: no phantom, the catalog replays what it lost",
		run: asyncFailoverFlushed, promotions: 2, catalogs: 2, replicated: asynchronous,
		promotionFlags: []string{"--relay-standby-flush", standbyName}},
	{num: 23, name: "(m) synchronous failover with a multi-host DSN", run: syncFailover, promotions: 2, catalogs: 2,
		replicated: synchronous},
	{num: 24, name: "(n) dump and restore into a fresh cluster under traffic", run: restoreIntoFreshCluster, promotions: 2, catalogs: 2,
		replicated: single, pgVia: []string{"*"}, kafkaVia: []string{"promotion-1", "promotion-2"}},
	{num: 25, name: "(o) a standby at the primary's address", run: standbyAtPrimaryAddress, promotions: 2, catalogs: 1,
		replicated: synchronous, pgVia: []string{"*"}},
	{num: 26, name: "(l') asynchronous failover without the standby flush: reconcile repairs every phantom",
		run: asyncFailoverReconciled, promotions: 2, catalogs: 2, replicated: asynchronous},
	{num: 27, name: "upgrade: the previous release and the head under traffic", run: upgradeUnderTraffic, promotions: 2, catalogs: 2,
		previous: true, test: "TestUpgrade_PreviousReleaseAndHeadUnderTraffic"},
	{num: 28, name: "rollback: the previous release on the head's schema", run: rollbackOnHeadSchema, promotions: 2, catalogs: 2,
		previous: true, test: "TestRollback_PreviousReleaseOnHeadSchema"},
}

// TestFaults runs every scenario in turn, prints one line per scenario and a
// final "N passed, N failed" line.
func TestFaults(t *testing.T) {
	s := newSuite(t)
	var results []result
	for _, sc := range scenarios {
		if *only != "" && !slices.ContainsFunc(strings.Split(*only, ","), func(o string) bool {
			return strings.Contains(fmt.Sprintf("%d %s", sc.num, sc.name), o)
		}) {
			continue
		}
		if sc.full && *form != "full" {
			continue
		}
		r := result{num: sc.num, name: sc.name}
		start := time.Now()
		failed := false
		t.Run(cmp.Or(sc.test, fmt.Sprintf("%02d", sc.num)), func(t *testing.T) {
			defer func() { failed = t.Failed() }()
			// A scenario starts on a whole stack, even when the one before
			// failed with a server of it down.
			s.stack(t, "up")
			e := newEnv(t, s, sc)
			if !e.waitReady(60 * time.Second) {
				t.Fatal("processes did not become ready")
			}
			// A quiet start: no alert of the previous scenario, or of the
			// time before these processes ran, still fires.
			for _, alert := range []string{"PromotionProcessesDown", "CatalogProcessesDown", "PromotionExpireJobStalled",
				"CatalogPromotionLagHigh", "CatalogPromotionDeadLetters", "PromotionOutboxBacklogHigh", "PromotionRelayCutOffFromKafka"} {
				e.expectAlert(alert, false, time.Minute)
			}
			r.events = sc.run(t, e)
			r.recovery = e.quiesce(3 * time.Minute)
			e.checkDrift()
			e.finish()
			e.mu.Lock()
			r.violations, r.faults, r.detail = e.violations, e.faults, e.detail
			e.mu.Unlock()
			for _, v := range r.violations {
				t.Error(v)
			}
		})
		r.took = time.Since(start)
		if failed && len(r.violations) == 0 {
			r.violations = []string{"the scenario failed (see the test log)"}
		}
		results = append(results, r)
		fmt.Println(r.line())
	}
	passed := 0
	for _, r := range results {
		if len(r.violations) == 0 {
			passed++
		}
	}
	fmt.Println()
	for _, r := range results {
		fmt.Println(r.line())
	}
	fmt.Printf("faults: %d passed, %d failed\n", passed, len(results)-passed)
}

// expectAlert waits until alert is firing (or not), and records a violation
// when it does not get there within timeout, or Prometheus cannot say.
func (e *env) expectAlert(alert string, firing bool, timeout time.Duration) {
	var err error
	if _, ok := eventually(e.ctx, timeout, func() bool {
		var now bool
		now, err = e.s.prom.firing(alert)
		return err != nil || now == firing
	}); err != nil {
		e.violate("alert %s: %v", alert, err)
	} else if !ok {
		e.violate("alert %s: want firing=%t within %s", alert, firing, timeout)
	}
}

// createMany makes n purchases through the API, with workers requests in
// flight, the i-th ending at endsAt(i), and returns their ids with their
// tenants' tokens and EndsAt.
func (e *env) createMany(n, workers int, endsAt func(i int) time.Time) map[string]made {
	tr := e.newTraffic(30 * time.Second)
	var mu sync.Mutex
	out := map[string]made{}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1)); i <= n; i = int(next.Add(1)) {
				tn := e.tenants[i%len(e.tenants)]
				ends := endsAt(i)
				body := map[string]any{"PackageKind": "Top", "BoostWeight": 5, "Targets": e.randomTargets(),
					"EndsAt": ends.UTC().Format(time.RFC3339Nano)}
				status, resp := tr.call(e.ctx, http.MethodPost, "/promotions", tn.token, body)
				if status != http.StatusCreated {
					e.violate("create %d of %d: %d", i, n, status)
					continue
				}
				mu.Lock()
				out[resp["Id"].(string)] = made{token: tn.token, endsAt: ends}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// made is a purchase the API answered 201 for.
type made struct {
	token  string
	endsAt time.Time
}

// burst makes n purchases through the API that all end at one instant, a few
// seconds after the last of them is created (at about perSecond a second),
// and n/2 more, created among them, that end hours later. It returns the
// first n with their tenants' tokens, and the instant.
func (e *env) burst(n, perSecond int) (map[string]string, time.Time) {
	far := n / 2
	endsAt := time.Now().Add(time.Duration((n+far)/perSecond+5) * time.Second)
	all := e.createMany(n+far, 16, func(i int) time.Time {
		if i%3 == 0 {
			return farEndsAt()
		}
		return endsAt
	})
	due := map[string]string{}
	for id, m := range all {
		if m.endsAt.Equal(endsAt) {
			due[id] = m.token
		}
	}
	return due, endsAt
}
