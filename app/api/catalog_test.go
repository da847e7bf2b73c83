package api_test

import (
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/app/api"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/router/rebuild"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

func setupCatalogAPI(t *testing.T) apiBundle {
	t.Helper()
	t.Parallel()
	return newCatalogAPI(t)
}

// newCatalogAPI serves the catalog API on a database and a topic of its own,
// every exchange checked against the OpenAPI document.
func newCatalogAPI(t *testing.T) apiBundle {
	t.Helper()
	db := pgtest.DB(t)
	mux := http.NewServeMux()
	log := slog.New(slog.DiscardHandler)
	rb, err := rebuild.New(rebuild.Config{DB: db, Kafka: kafkatest.Cluster(t), Topic: kafkatest.Topic(t, 1), Log: log})
	require.NoError(t, err)
	t.Cleanup(rb.Stop)
	(&api.Catalog{DB: db, AdminToken: "admin", Rebuilder: rb, Log: log}).Register(mux)
	return apiBundle{db: db, srv: validatedServer(t, catalogDocument, mux)}
}

func TestCatalogAPI_FeedUpsertsCardsAndReadsShowTheBoost(t *testing.T) {
	b := setupCatalogAPI(t)
	project, object := uuid.NewString(), uuid.NewString()
	r := b.do(t, "PUT", "/cards/projects/"+project, "admin", map[string]any{"Title": "Tower", "Status": "Published",
		"Visibility": "Visible", "MinPrice": 1500000.5, "PropertyObjectsAvailable": 12})
	require.Equal(t, http.StatusOK, r.Status, r.Body)
	require.EqualValues(t, 0, r.Body["PromotionBoost"])
	require.EqualValues(t, 1500000.5, r.Body["MinPrice"])

	r = b.do(t, "PUT", "/cards/property-objects/"+object, "admin", map[string]any{"ProjectId": project, "Published": true})
	require.Equal(t, http.StatusOK, r.Status, r.Body)
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/cards/projects/"+project, "", nil).Status)
	require.Len(t, b.do(t, "GET", "/cards/projects/"+project+"/property-objects", "", nil).Body["items"], 1)
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/cards/property-objects/"+object, "", nil).Status)
	require.Equal(t, http.StatusNotFound, b.do(t, "GET", "/cards/projects/"+uuid.NewString(), "", nil).Status)
}

func TestCatalogAPI_FeedRejectsBadInputAndStrangers(t *testing.T) {
	b := setupCatalogAPI(t)
	id := uuid.NewString()
	require.Equal(t, http.StatusUnauthorized, b.do(t, "PUT", "/cards/projects/"+id, "", map[string]any{}).Status)
	require.Equal(t, http.StatusUnauthorized, b.do(t, "PUT", "/cards/projects/"+id, "wrong", map[string]any{}).Status)
	require.Equal(t, http.StatusBadRequest, b.do(t, "PUT", "/cards/projects/not-a-uuid", "admin", map[string]any{}).Status)
	require.Equal(t, http.StatusBadRequest, b.do(t, "PUT", "/cards/projects/"+id, "admin", map[string]any{"PromotionBost": 5}).Status)
	require.Equal(t, http.StatusUnprocessableEntity, b.do(t, "PUT", "/cards/property-objects/"+id, "admin",
		map[string]any{"Published": true}).Status, "a property object needs its project")
	var n int
	require.NoError(t, b.db.Get(&n, `SELECT (SELECT count(*) FROM catalog.project_cards) + (SELECT count(*) FROM catalog.property_object_cards)`))
	require.Zero(t, n)
}

func TestCatalogAPI_RebuildIsAdminOnlyAndReportsItsState(t *testing.T) {
	b := setupCatalogAPI(t)
	require.Equal(t, http.StatusUnauthorized, b.do(t, "POST", "/admin/projections/rebuild", "", nil).Status)
	require.Equal(t, "idle", b.do(t, "GET", "/admin/projections/rebuild", "admin", nil).Body["state"])

	r := b.do(t, "POST", "/admin/projections/rebuild", "admin", nil)
	require.Equal(t, http.StatusAccepted, r.Status, r.Body)
	require.NotEmpty(t, r.Body["id"])
	require.Eventually(t, func() bool {
		return b.do(t, "GET", "/admin/projections/rebuild", "admin", nil).Body["state"] == "done"
	}, 30*time.Second, 20*time.Millisecond)
	done := b.do(t, "GET", "/admin/projections/rebuild", "admin", nil).Body
	require.Equal(t, r.Body["id"], done["id"])
	for _, field := range []string{"phase", "offsetsDone", "offsetsTotal", "read", "skipped", "refused", "purchases",
		"contributions", "catchUps", "cardsChanged"} {
		require.Contains(t, done, field, "the status reports progress")
	}
}
