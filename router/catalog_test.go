package router_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/app/testenv"
	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router"
)

type catalogBundle struct {
	db      *sqlx.DB
	cfg     router.CatalogConfig
	metrics *router.CatalogMetrics
	catalog *router.Catalog
	pub     *kafka.Publisher
}

func setupCatalog(t *testing.T, enabled bool) *catalogBundle {
	t.Helper()
	t.Parallel()
	return newCatalogBundle(t, enabled)
}

func newCatalogBundle(t testing.TB, enabled bool) *catalogBundle {
	t.Helper()
	b := &catalogBundle{
		db: testenv.DB(t),
		cfg: router.CatalogConfig{
			Brokers: testenv.Brokers(t), Enabled: enabled,
			Topic: testenv.Topic(t, 3), ReplayTopic: testenv.Topic(t, 1), DLQTopic: testenv.Topic(t, 1),
			ConsumerGroup: "pf-test-catalog-" + testenv.RandomSuffix(),
			RetryInitial:  10 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		},
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: b.cfg.Brokers, Marshaler: kafka.NewWithPartitioningMarshaler(event.PartitionKey),
		OverwriteSaramaConfig: router.DurableProducerConfig("test-producer"),
	}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	b.pub = pub
	return b
}

// start runs the catalog router until the test ends.
func (b *catalogBundle) start(t testing.TB) {
	t.Helper()
	m, err := router.NewCatalogMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	b.metrics = m
	c, err := router.NewCatalog(b.db, m, slog.New(slog.DiscardHandler), b.cfg)
	require.NoError(t, err)
	b.catalog = c
	runUntilCleanup(t, c.Run, c.Ready)
}

// produce publishes ev to the purchase-changed topic as the relay would and
// returns its message.
func (b *catalogBundle) produce(t testing.TB, ev event.PurchaseChanged) *message.Message {
	t.Helper()
	msg, err := event.NewMessage(ev, "test", time.Now())
	require.NoError(t, err)
	require.NoError(t, b.pub.Publish(b.cfg.Topic, msg))
	return msg
}

func (b *catalogBundle) projectCard(t testing.TB, id uuid.UUID) {
	t.Helper()
	tx := b.db.MustBegin()
	price := "1000000"
	require.NoError(t, boost.UpsertProjectCardTx(context.Background(), tx, boost.ProjectCard{ID: id, Title: "P",
		Status: "Published", Visibility: "Visible", MinPrice: &price, PropertyObjectsAvailable: 3, Payback: &price}))
	require.NoError(t, tx.Commit())
}

func (b *catalogBundle) objectCard(t testing.TB, id, project uuid.UUID, published bool) {
	t.Helper()
	tx := b.db.MustBegin()
	price := "250000"
	require.NoError(t, boost.UpsertPropertyObjectCardTx(context.Background(), tx, boost.PropertyObjectCard{
		ID: id, ProjectID: project, Published: published, Status: "OnSale", Price: &price}))
	require.NoError(t, tx.Commit())
}

func (b *catalogBundle) boostOf(kind event.TargetKind, id uuid.UUID) int {
	var n int
	table := "catalog.project_cards"
	if kind == event.TargetPropertyObject {
		table = "catalog.property_object_cards"
	}
	if err := b.db.Get(&n, `SELECT promotion_boost FROM `+table+` WHERE id = $1`, id); err != nil {
		return -1
	}
	return n
}

func (b *catalogBundle) waitBoost(t testing.TB, kind event.TargetKind, id uuid.UUID, want int) {
	t.Helper()
	require.Eventually(t, func() bool { return b.boostOf(kind, id) == want }, 30*time.Second, 10*time.Millisecond,
		"%s %s: want boost %d, have %d", kind, id, want, b.boostOf(kind, id))
}

// waitConsumed waits until n events were handled (any outcome).
func (b *catalogBundle) waitConsumed(t *testing.T, n float64) {
	t.Helper()
	b.waitConsumedTB(t, n, 30*time.Second)
}

func (b *catalogBundle) waitConsumedTB(t testing.TB, n float64, timeout time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		var sum float64
		for _, o := range []string{"applied", "stale", "duplicate", "post_only"} {
			sum += testutil.ToFloat64(b.metrics.Consumed.WithLabelValues(o))
		}
		return sum >= n
	}, timeout, 10*time.Millisecond)
}

func purchaseEvent(status event.Status, version int64, weight int, targets ...event.Target) event.PurchaseChanged {
	return event.PurchaseChanged{PurchaseId: uuid.New(), TenantId: uuid.New(), PackageKind: "Top", Targets: targets,
		BoostWeight: weight, Status: status, PaymentStatus: "NotRequired",
		StartsAt: time.Now().Add(-time.Hour).UTC(), EndsAt: time.Now().Add(time.Hour).UTC(), Version: version}
}

func target(kind event.TargetKind, id uuid.UUID) event.Target {
	return event.Target{TargetKind: kind, TargetId: id}
}

func TestCatalog_ActivationOnPropertyObjectIncludesProjectCascade(t *testing.T) {
	b := setupCatalog(t, true)
	project, object := uuid.New(), uuid.New()
	b.projectCard(t, project)
	b.objectCard(t, object, project, true)
	b.start(t)

	b.produce(t, purchaseEvent(event.StatusActive, 1, 20, target(event.TargetProject, project)))
	b.produce(t, purchaseEvent(event.StatusActive, 1, 50, target(event.TargetPropertyObject, object)))
	b.waitBoost(t, event.TargetPropertyObject, object, 70)
	b.waitBoost(t, event.TargetProject, project, 20)
	var active int
	require.NoError(t, b.db.Get(&active, `SELECT count(*) FROM catalog.promotion_contributions WHERE active`))
	require.Equal(t, 2, active)
}

func TestCatalog_ProjectTargetCascadesToPublishedObjects(t *testing.T) {
	b := setupCatalog(t, true)
	project, published, draft := uuid.New(), uuid.New(), uuid.New()
	b.projectCard(t, project)
	b.objectCard(t, published, project, true)
	b.objectCard(t, draft, project, false)
	b.start(t)

	b.produce(t, purchaseEvent(event.StatusActive, 1, 30, target(event.TargetProject, project)))
	b.waitBoost(t, event.TargetProject, project, 30)
	b.waitBoost(t, event.TargetPropertyObject, published, 30)
	require.Zero(t, b.boostOf(event.TargetPropertyObject, draft), "an unpublished object gets no cascade")
}

func TestCatalog_ExpiredOrCancelledRemovesTheBoost(t *testing.T) {
	b := setupCatalog(t, true)
	project, object := uuid.New(), uuid.New()
	b.projectCard(t, project)
	b.objectCard(t, object, project, true)
	b.start(t)

	expiring := purchaseEvent(event.StatusActive, 1, 10, target(event.TargetProject, project))
	cancelling := purchaseEvent(event.StatusActive, 1, 5, target(event.TargetPropertyObject, object))
	b.produce(t, expiring)
	b.produce(t, cancelling)
	b.waitBoost(t, event.TargetPropertyObject, object, 15)

	expiring.Status, expiring.Version = event.StatusExpired, 2
	b.produce(t, expiring)
	b.waitBoost(t, event.TargetProject, project, 0)
	b.waitBoost(t, event.TargetPropertyObject, object, 5)

	cancelling.Status, cancelling.Version = event.StatusCancelled, 2
	b.produce(t, cancelling)
	b.waitBoost(t, event.TargetPropertyObject, object, 0)
}

func TestCatalog_PostOnlyEventIsAckedWithAMetric(t *testing.T) {
	b := setupCatalog(t, true)
	b.start(t)
	b.produce(t, purchaseEvent(event.StatusActive, 1, 10, target(event.TargetPost, uuid.New())))
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(b.metrics.Consumed.WithLabelValues("post_only")) == 1
	}, 30*time.Second, 10*time.Millisecond)
	var n int
	require.NoError(t, b.db.Get(&n, `SELECT count(*) FROM catalog.promotion_contributions`))
	require.Zero(t, n)
	require.Zero(t, testutil.ToFloat64(b.metrics.DLQ))
}

func TestCatalog_CardThatIsNotThereYetGetsItsBoostOnArrival(t *testing.T) {
	b := setupCatalog(t, true)
	b.start(t)
	project, object := uuid.New(), uuid.New()
	b.produce(t, purchaseEvent(event.StatusActive, 1, 40, target(event.TargetProject, project)))
	b.produce(t, purchaseEvent(event.StatusActive, 1, 2, target(event.TargetPropertyObject, object)))
	b.waitConsumed(t, 2)
	require.Zero(t, testutil.ToFloat64(b.metrics.DLQ), "a missing card is not an error")

	b.projectCard(t, project)
	b.objectCard(t, object, project, true)
	require.Equal(t, 40, b.boostOf(event.TargetProject, project))
	require.Equal(t, 42, b.boostOf(event.TargetPropertyObject, object))
}

func TestCatalog_StaleAndDuplicateEventsHaveNoEffect(t *testing.T) {
	b := setupCatalog(t, true)
	project := uuid.New()
	b.projectCard(t, project)
	b.start(t)

	ev := purchaseEvent(event.StatusActive, 1, 10, target(event.TargetProject, project))
	first := b.produce(t, ev)
	b.waitBoost(t, event.TargetProject, project, 10)

	// The same record delivered again (same MessageId): a no-op ack.
	require.NoError(t, b.pub.Publish(b.cfg.Topic, first))
	ev.Status, ev.Version = event.StatusCancelled, 3
	b.produce(t, ev)
	b.waitBoost(t, event.TargetProject, project, 0)
	// An older snapshot arriving late must not bring the boost back.
	ev.Status, ev.Version = event.StatusActive, 2
	b.produce(t, ev)
	b.waitConsumed(t, 4)
	require.Equal(t, 1.0, testutil.ToFloat64(b.metrics.Consumed.WithLabelValues("duplicate")))
	require.Equal(t, 1.0, testutil.ToFloat64(b.metrics.Stale))
	require.Zero(t, b.boostOf(event.TargetProject, project))
}

func TestCatalog_FlagOffDoesNotSubscribeAndALaterRunAppliesTheEvents(t *testing.T) {
	b := setupCatalog(t, false)
	project := uuid.New()
	b.projectCard(t, project)
	b.start(t)
	b.produce(t, purchaseEvent(event.StatusActive, 1, 25, target(event.TargetProject, project)))

	require.Empty(t, b.catalog.Router.Handlers(), "no subscription while the flag is off")
	require.Never(t, func() bool { return b.boostOf(event.TargetProject, project) != 0 }, time.Second, 50*time.Millisecond)

	b.cfg.Enabled = true
	b.start(t)
	b.waitBoost(t, event.TargetProject, project, 25)
}

func TestCatalog_BoostNeverTouchesStatusVisibilityOrPriceAggregates(t *testing.T) {
	b := setupCatalog(t, true)
	project, object := uuid.New(), uuid.New()
	b.projectCard(t, project)
	b.objectCard(t, object, project, true)
	type snapshot struct {
		Status, Visibility, MinPrice, Payback string
		Available                             int
		ObjStatus, Price                      string
		Published                             bool
	}
	read := func() snapshot {
		var s snapshot
		require.NoError(t, b.db.QueryRow(`SELECT p.status, p.visibility, p.min_price::text, p.payback::text,
			p.property_objects_available, o.status, o.price::text, o.published
			FROM catalog.project_cards p JOIN catalog.property_object_cards o ON o.project_id = p.id WHERE p.id = $1`, project).
			Scan(&s.Status, &s.Visibility, &s.MinPrice, &s.Payback, &s.Available, &s.ObjStatus, &s.Price, &s.Published))
		return s
	}
	before := read()
	b.start(t)
	ev := purchaseEvent(event.StatusActive, 1, 60, target(event.TargetProject, project), target(event.TargetPropertyObject, object))
	b.produce(t, ev)
	b.waitBoost(t, event.TargetPropertyObject, object, 120)
	require.Equal(t, before, read())
	ev.Status, ev.Version = event.StatusExpired, 2
	b.produce(t, ev)
	b.waitBoost(t, event.TargetPropertyObject, object, 0)
	require.Equal(t, before, read(), "INV-1: status, visibility and price aggregates are untouched")
}
