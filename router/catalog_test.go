package router_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/catalogtest"
)

// setupCatalog is a bundle of the test's own, run in parallel with others.
func setupCatalog(t *testing.T, enabled bool) *catalogtest.Bundle {
	t.Helper()
	t.Parallel()
	return catalogtest.New(t, enabled)
}

func TestCatalog_ActivationOnPropertyObjectIncludesProjectCascade(t *testing.T) {
	b := setupCatalog(t, true)
	project, object := uuid.New(), uuid.New()
	b.ProjectCard(t, project)
	b.ObjectCard(t, object, project, true)
	b.Start(t)

	b.Produce(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 20, catalogtest.Target(event.TargetProject, project)))
	b.Produce(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 50, catalogtest.Target(event.TargetPropertyObject, object)))
	b.WaitBoost(t, event.TargetPropertyObject, object, 70)
	b.WaitBoost(t, event.TargetProject, project, 20)
	var active int
	require.NoError(t, b.DB.Get(&active, `SELECT count(*) FROM catalog.promotion_contributions WHERE active`))
	require.Equal(t, 2, active)
}

func TestCatalog_ProjectTargetCascadesToPublishedObjects(t *testing.T) {
	b := setupCatalog(t, true)
	project, published, draft := uuid.New(), uuid.New(), uuid.New()
	b.ProjectCard(t, project)
	b.ObjectCard(t, published, project, true)
	b.ObjectCard(t, draft, project, false)
	b.Start(t)

	b.Produce(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 30, catalogtest.Target(event.TargetProject, project)))
	b.WaitBoost(t, event.TargetProject, project, 30)
	b.WaitBoost(t, event.TargetPropertyObject, published, 30)
	require.Zero(t, b.BoostOf(event.TargetPropertyObject, draft), "an unpublished object gets no cascade")
}

func TestCatalog_ExpiredOrCancelledRemovesTheBoost(t *testing.T) {
	b := setupCatalog(t, true)
	project, object := uuid.New(), uuid.New()
	b.ProjectCard(t, project)
	b.ObjectCard(t, object, project, true)
	b.Start(t)

	expiring := catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetProject, project))
	cancelling := catalogtest.PurchaseEvent(event.StatusActive, 1, 5, catalogtest.Target(event.TargetPropertyObject, object))
	b.Produce(t, expiring)
	b.Produce(t, cancelling)
	b.WaitBoost(t, event.TargetPropertyObject, object, 15)

	expiring.Status, expiring.Version = event.StatusExpired, 2
	b.Produce(t, expiring)
	b.WaitBoost(t, event.TargetProject, project, 0)
	b.WaitBoost(t, event.TargetPropertyObject, object, 5)

	cancelling.Status, cancelling.Version = event.StatusCancelled, 2
	b.Produce(t, cancelling)
	b.WaitBoost(t, event.TargetPropertyObject, object, 0)
}

func TestCatalog_PostOnlyEventIsAckedWithAMetric(t *testing.T) {
	b := setupCatalog(t, true)
	b.Start(t)
	b.Produce(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetPost, uuid.New())))
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(b.Metrics.Consumed.WithLabelValues("post_only")) == 1
	}, 30*time.Second, 10*time.Millisecond)
	var n int
	require.NoError(t, b.DB.Get(&n, `SELECT count(*) FROM catalog.promotion_contributions`))
	require.Zero(t, n)
	require.Zero(t, testutil.ToFloat64(b.Metrics.DLQ))
}

func TestCatalog_CardThatIsNotThereYetGetsItsBoostOnArrival(t *testing.T) {
	b := setupCatalog(t, true)
	b.Start(t)
	project, object := uuid.New(), uuid.New()
	b.Produce(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 40, catalogtest.Target(event.TargetProject, project)))
	b.Produce(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 2, catalogtest.Target(event.TargetPropertyObject, object)))
	b.WaitConsumed(t, 2, 30*time.Second)
	require.Zero(t, testutil.ToFloat64(b.Metrics.DLQ), "a missing card is not an error")

	b.ProjectCard(t, project)
	b.ObjectCard(t, object, project, true)
	require.Equal(t, 40, b.BoostOf(event.TargetProject, project))
	require.Equal(t, 42, b.BoostOf(event.TargetPropertyObject, object))
}

func TestCatalog_StaleAndDuplicateEventsHaveNoEffect(t *testing.T) {
	b := setupCatalog(t, true)
	project := uuid.New()
	b.ProjectCard(t, project)
	b.Start(t)

	ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetProject, project))
	first := b.Produce(t, ev)
	b.WaitBoost(t, event.TargetProject, project, 10)

	// The same record delivered again (same MessageId): a no-op ack.
	require.NoError(t, b.Pub.Publish(b.Cfg.Topic, first))
	ev.Status, ev.Version = event.StatusCancelled, 3
	b.Produce(t, ev)
	b.WaitBoost(t, event.TargetProject, project, 0)
	// An older snapshot arriving late must not bring the boost back.
	ev.Status, ev.Version = event.StatusActive, 2
	b.Produce(t, ev)
	b.WaitConsumed(t, 4, 30*time.Second)
	require.Equal(t, 1.0, testutil.ToFloat64(b.Metrics.Consumed.WithLabelValues("duplicate")))
	require.Equal(t, 1.0, testutil.ToFloat64(b.Metrics.Stale))
	require.Zero(t, b.BoostOf(event.TargetProject, project))
}

func TestCatalog_FlagOffDoesNotSubscribeAndALaterRunAppliesTheEvents(t *testing.T) {
	b := setupCatalog(t, false)
	project := uuid.New()
	b.ProjectCard(t, project)
	b.Start(t)
	b.Produce(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 25, catalogtest.Target(event.TargetProject, project)))

	require.Empty(t, b.Catalog.Router.Handlers(), "no subscription while the flag is off")
	require.Never(t, func() bool { return b.BoostOf(event.TargetProject, project) != 0 }, time.Second, 50*time.Millisecond)

	b.Cfg.Enabled = true
	b.Start(t)
	b.WaitBoost(t, event.TargetProject, project, 25)
}

func TestCatalog_BoostNeverTouchesStatusVisibilityOrPriceAggregates(t *testing.T) {
	b := setupCatalog(t, true)
	project, object := uuid.New(), uuid.New()
	b.ProjectCard(t, project)
	b.ObjectCard(t, object, project, true)
	type snapshot struct {
		Status, Visibility, MinPrice, Payback string
		Available                             int
		ObjStatus, Price                      string
		Published                             bool
	}
	read := func() snapshot {
		var s snapshot
		require.NoError(t, b.DB.QueryRow(`SELECT p.status, p.visibility, p.min_price::text, p.payback::text,
			p.property_objects_available, o.status, o.price::text, o.published
			FROM catalog.project_cards p JOIN catalog.property_object_cards o ON o.project_id = p.id WHERE p.id = $1`, project).
			Scan(&s.Status, &s.Visibility, &s.MinPrice, &s.Payback, &s.Available, &s.ObjStatus, &s.Price, &s.Published))
		return s
	}
	before := read()
	b.Start(t)
	ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 60, catalogtest.Target(event.TargetProject, project), catalogtest.Target(event.TargetPropertyObject, object))
	b.Produce(t, ev)
	b.WaitBoost(t, event.TargetPropertyObject, object, 120)
	require.Equal(t, before, read())
	ev.Status, ev.Version = event.StatusExpired, 2
	b.Produce(t, ev)
	b.WaitBoost(t, event.TargetPropertyObject, object, 0)
	require.Equal(t, before, read(), "INV-1: status, visibility and price aggregates are untouched")
}
