package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// pooled is both contexts' processes on one database of the test's own, with
// DATABASE_URL through a PgBouncer in transaction pooling: as many server
// connections (5) as a handful of clients, so that every process's
// transactions take turns on them.
type pooled struct {
	direct  string // the server itself
	bouncer *pgtest.PgBouncer
	db      *sqlx.DB // direct, for the test's own reads
	topic   string
}

const (
	pooledToken  = "pooled-tenant-token"
	pooledTenant = "0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b"
	pooledAdmin  = "pooled-admin-token"
)

func setupPooled(t *testing.T) *pooled {
	t.Helper()
	direct := pgtest.DatabaseURL(t)
	p := &pooled{direct: direct, bouncer: pgtest.StartPgBouncer(t, pgtest.PgBouncerOptions{Upstream: direct}),
		topic: "pf-test-" + kafkatest.RandomSuffix()}
	for _, topic := range []string{p.topic, p.topic + "-replay", p.topic + "-dlq"} {
		kafkatest.CleanupTopic(t, topic)
	}
	p.db = openTest(t, direct)
	return p
}

// env is what every process of the test gets: the database through the pooler.
func (p *pooled) env(t *testing.T, addr string, more ...string) []string {
	return append([]string{"DATABASE_URL=" + p.bouncer.URL(), "KAFKA_BROKERS=" + strings.Join(kafkatest.Brokers(t), ","),
		"HTTP_ADDR=" + addr, "PROMOTION_TOPIC=" + p.topic, "KAFKA_TOPIC_PARTITIONS=4", "LOG_LEVEL=info"}, more...)
}

// startPromotion runs the promotion process; it migrates at start, on the
// direct URL.
func (p *pooled) startPromotion(t *testing.T) (string, *command) {
	addr := freeAddr(t)
	proc := startCommand(t, envOf(p.env(t, addr, "MIGRATE_ON_START=true", "DATABASE_DIRECT_URL="+p.direct, "EXPIRE_INTERVAL=500ms",
		"PROMOTION_API_TOKENS="+pooledToken+"="+pooledTenant)...), "promotion")
	proc.waitReady(t, addr)
	return addr, proc
}

// startCatalog runs the catalog process with prepared statements off; it
// migrates at start, through the pooler.
func (p *pooled) startCatalog(t *testing.T) (string, *command) {
	addr := freeAddr(t)
	proc := startCommand(t, envOf(p.env(t, addr, "MIGRATE_ON_START=true", "DATABASE_PREPARED_STATEMENTS=false", "CATALOG_ADMIN_TOKEN="+pooledAdmin,
		"CATALOG_REPLAY_TOPIC="+p.topic+"-replay", "CATALOG_DLQ_TOPIC="+p.topic+"-dlq",
		"CATALOG_CONSUMER_GROUP=pf-test-"+kafkatest.RandomSuffix(), "CATALOG_RETRY_MAX=2s")...), "catalog")
	proc.waitReady(t, addr)
	return addr, proc
}

// TestPgBouncer_PipelineRunsInTransactionPooling: with every process's
// DATABASE_URL on a PgBouncer in transaction pooling, a purchase goes API →
// outbox → relay → Kafka → consumer → card, the expirer takes a short one's
// boost away, and a projection rebuild (one at a time, held by its lease row)
// ends with the same cards.
func TestPgBouncer_PipelineRunsInTransactionPooling(t *testing.T) {
	t.Parallel()
	p := setupPooled(t)
	promotion, promotionProc := p.startPromotion(t)
	catalog, catalogProc := p.startCatalog(t)
	project, object := uuid.New(), uuid.New()
	adminCall(t, "PUT", catalog, "/cards/projects/"+project.String(), `{"Title":"Pooled"}`, http.StatusOK)
	adminCall(t, "PUT", catalog, "/cards/property-objects/"+object.String(),
		fmt.Sprintf(`{"ProjectId":%q,"Published":true}`, project), http.StatusOK)

	long, err := postPurchase(promotion, pooledToken, project, 30, time.Hour)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, long.Status, long.Body)
	short, err := postPurchase(promotion, pooledToken, project, 12, 3*time.Second)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, short.Status, short.Body)
	waitBoost(t, catalog, "/cards/projects/"+project.String(), 42)
	waitBoost(t, catalog, "/cards/property-objects/"+object.String(), 42)
	waitBoost(t, catalog, "/cards/projects/"+project.String(), 30) // the short one expired

	adminCall(t, "POST", catalog, "/admin/projections/rebuild", "", http.StatusAccepted)
	adminCall(t, "POST", catalog, "/admin/projections/rebuild", "", http.StatusConflict, http.StatusAccepted, http.StatusTooManyRequests)
	require.Eventually(t, func() bool {
		var st struct{ State string }
		require.NoError(t, json.Unmarshal([]byte(adminCall(t, "GET", catalog, "/admin/projections/rebuild", "", http.StatusOK)), &st))
		return st.State == "done"
	}, 60*time.Second, 100*time.Millisecond, "the rebuild ends")
	waitBoost(t, catalog, "/cards/projects/"+project.String(), 30)
	waitBoost(t, catalog, "/cards/property-objects/"+object.String(), 30)

	for _, proc := range []*command{promotionProc, catalogProc} {
		out := proc.out.String()
		for _, broken := range []string{"prepared statement", "bind message", `"level":"ERROR"`} {
			require.NotContains(t, out, broken, "a process behind the pooler")
		}
	}
}

// TestPgBouncer_RestartMidTrafficLosesNothing restarts PgBouncer (SIGTERM:
// every connection cut, transactions in flight too) while clients create
// purchases and the consumer has events to apply: the API answers 503 with
// Retry-After while the pool is down and never 500, both processes report
// unready, and afterwards every purchase's latest state is on the topic and
// every card equals what the purchases say.
func TestPgBouncer_RestartMidTrafficLosesNothing(t *testing.T) {
	t.Parallel()
	p := setupPooled(t)
	promotion, promotionProc := p.startPromotion(t)
	catalog, catalogProc := p.startCatalog(t)
	projects := make([]uuid.UUID, 5)
	for i := range projects {
		projects[i] = uuid.New()
		adminCall(t, "PUT", catalog, "/cards/projects/"+projects[i].String(), `{"Title":"Pooled"}`, http.StatusOK)
	}

	tr := &traffic{}
	stop := tr.run(promotion, projects, 4)
	defer stop()
	tr.waitFor(t, http.StatusCreated, 20)
	// The consumer is held back while purchases reach the topic, so that it
	// has events to apply while the pool is down. Stopped inside one of its
	// transactions, it holds no outbox writer lock, so the relay goes on.
	catalogProc.signal(t, syscall.SIGSTOP)
	tr.waitFor(t, http.StatusCreated, tr.count(http.StatusCreated)+20)
	onTopic := tr.count(http.StatusCreated)
	require.Eventually(t, func() bool {
		return catalogtest.TopicSize(t, p.topic) >= int64(onTopic)
	}, 60*time.Second, 50*time.Millisecond, "the relay publishes the purchases")

	p.bouncer.Stop(t)
	catalogProc.signal(t, syscall.SIGCONT)
	tr.waitFor(t, http.StatusServiceUnavailable, 3)
	for _, addr := range []string{promotion, catalog} {
		require.Eventually(t, func() bool { return readyz(addr) == http.StatusServiceUnavailable }, 30*time.Second,
			20*time.Millisecond, "%s/readyz says the database is down", addr)
	}
	// The consumer waits for the database: it retries the events it cannot
	// apply, or, when its stop outlasted its group session and it rejoined,
	// it cannot read its partitions' offsets and joins again until it can.
	require.Eventually(t, func() bool {
		out := catalogProc.out.String()
		return strings.Contains(out, `"msg":"retrying"`) || strings.Contains(out, `"msg":"consumer-offsets-unreadable"`)
	}, 60*time.Second, 20*time.Millisecond, "the consumer waits for the database: it retries the events it cannot apply")
	p.bouncer.Start(t)
	tr.waitFor(t, http.StatusCreated, tr.count(http.StatusCreated)+20)
	stop()
	t.Logf("answers: %v", tr.counts())
	require.Empty(t, tr.wrong(), "answers other than 201, or 503 with Retry-After")

	// Quiescence: every short purchase (two seconds) has expired; the rest
	// last an hour.
	require.Eventually(t, func() bool {
		var due int
		require.NoError(t, p.db.Get(&due, `SELECT count(*) FROM promotion.promotion_purchases
			WHERE status = 'Active' AND ends_at <= now() + interval '10 minutes'`))
		return due == 0
	}, 60*time.Second, 100*time.Millisecond, "the expirer catches up")
	var rows []struct {
		ID      uuid.UUID    `db:"id"`
		Status  event.Status `db:"status"`
		Version int64        `db:"version"`
	}
	require.NoError(t, p.db.Select(&rows, `SELECT id, status, version FROM promotion.promotion_purchases`))
	created := tr.created()
	stored := map[uuid.UUID]bool{}
	for _, r := range rows {
		stored[r.ID] = true
	}
	for _, id := range created {
		require.True(t, stored[id], "purchase %s was answered 201 and is stored", id)
	}

	latest := map[uuid.UUID]event.PurchaseChanged{}
	read := 0
	kafkatest.ReadTopic(t, p.topic, 90*time.Second, func(ms []*sarama.ConsumerMessage) bool {
		for ; read < len(ms); read++ {
			if ev, err := event.Parse(ms[read].Value); err == nil && ev.Version >= latest[ev.PurchaseId].Version {
				latest[ev.PurchaseId] = ev
			}
		}
		for _, r := range rows {
			if latest[r.ID].Version != r.Version {
				return false
			}
		}
		return true
	})
	for _, r := range rows {
		require.Equal(t, r.Status, latest[r.ID].Status, "purchase %s: its latest event is its row", r.ID)
	}
	require.Eventually(t, func() bool {
		var drifted int
		require.NoError(t, p.db.Get(&drifted, `SELECT count(*) FROM (`+projectTruthSQL+`) d`))
		return drifted == 0
	}, 60*time.Second, 100*time.Millisecond, "every card equals the sum of its Active purchases")
	for _, proc := range []*command{promotionProc, catalogProc} {
		select {
		case <-proc.done:
			t.Fatalf("a process ended:\n%s", proc.out.String())
		default:
		}
	}
}
