package api_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
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
	public, internal := http.NewServeMux(), http.NewServeMux()
	log := slog.New(slog.DiscardHandler)
	rb, err := rebuild.New(rebuild.Config{DB: db, Kafka: kafkatest.Cluster(t), Topic: kafkatest.Topic(t, 1), Log: log, Cooldown: time.Hour})
	require.NoError(t, err)
	t.Cleanup(rb.Stop)
	(&api.Catalog{DB: db, FeedToken: "feed", AdminToken: "admin", Rebuilder: rb, Log: log}).Register(public, internal)
	srv := httptest.NewServer(internal)
	t.Cleanup(srv.Close)
	return apiBundle{db: db, srv: validatedServer(t, catalogDocument, public), internal: srv}
}

func TestCatalogAPI_FeedUpsertsCardsAndReadsShowTheBoost(t *testing.T) {
	b := setupCatalogAPI(t)
	project, object := uuid.NewString(), uuid.NewString()
	r := b.do(t, "PUT", "/cards/projects/"+project, "feed", map[string]any{"Title": "Tower", "Status": "Published",
		"Visibility": "Public", "MinPrice": 1500000.5, "PropertyObjectsAvailable": 12})
	require.Equal(t, http.StatusOK, r.Status, r.Body)
	require.EqualValues(t, 0, r.Body["PromotionBoost"])
	require.EqualValues(t, 1500000.5, r.Body["MinPrice"])

	r = b.do(t, "PUT", "/cards/property-objects/"+object, "feed", map[string]any{"ProjectId": project, "Published": true})
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
	require.Equal(t, http.StatusBadRequest, b.do(t, "PUT", "/cards/projects/not-a-uuid", "feed", map[string]any{}).Status)
	require.Equal(t, http.StatusBadRequest, b.do(t, "PUT", "/cards/projects/"+id, "feed", map[string]any{"PromotionBost": 5}).Status)
	require.Equal(t, http.StatusUnprocessableEntity, b.do(t, "PUT", "/cards/property-objects/"+id, "feed",
		map[string]any{"Published": true}).Status, "a property object needs its project")
	for name, tc := range map[string]struct {
		path, body string
		status     int
		code       string
	}{
		// The 500s: a value beyond the column's type reached the INSERT.
		"count beyond integer":      {"projects", `{"PropertyObjectsAvailable":2147483648}`, 422, "validation_failed"},
		"price beyond numeric":      {"property-objects", `{"ProjectId":"` + id + `","Price":1e131072}`, 422, "validation_failed"},
		"string beyond the pattern": {"property-objects", `{"ProjectId":"` + id + `","Price":"-94.4E652990137"}`, 400, "malformed_json"},
		"min price beyond numeric":  {"projects", `{"MinPrice":-5e-16384}`, 422, "validation_failed"},
		// Within numeric's range, but its answer would be 10675 digits long.
		"price of four-digit exponent": {"property-objects", `{"ProjectId":"` + id + `","Price":9242.868E10671}`, 422, "validation_failed"},
		// The empty card from a null body.
		"null body":              {"projects", `null`, 422, "not_an_object"},
		"string body":            {"projects", `"card"`, 422, "not_an_object"},
		"U+0000 in a title":      {"projects", `{"Title":"To\u0000wer"}`, 422, "validation_failed"},
		"member in another case": {"projects", `{"title":"Tower"}`, 400, "malformed_json"},
		"fractional count":       {"projects", `{"PropertyObjectsAvailable":1.5}`, 400, "malformed_json"},
		"nil project":            {"property-objects", `{"ProjectId":"00000000-0000-0000-0000-000000000000"}`, 422, "validation_failed"},
	} {
		r := b.do(t, "PUT", "/cards/"+tc.path+"/"+id, "feed", tc.body)
		require.Equal(t, tc.status, r.Status, "%s: %v", name, r.Body)
		require.Equal(t, tc.code, r.Body["code"], name)
	}
	var n int
	require.NoError(t, b.db.Get(&n, `SELECT (SELECT count(*) FROM catalog.project_cards) + (SELECT count(*) FROM catalog.property_object_cards)`))
	require.Zero(t, n)
}

// TestCatalogAPI_FeedAcceptsEveryFormTheDocumentAllows: the bounds of the
// columns are in, decimals keep their digits, and what the feed ignores may
// hold anything, so that a card read can be sent back as it is.
func TestCatalogAPI_FeedAcceptsEveryFormTheDocumentAllows(t *testing.T) {
	b := setupCatalogAPI(t)
	project := uuid.NewString()
	for _, body := range []string{
		`{"PropertyObjectsAvailable":-2147483648,"MinPrice":"1e999","UpdatedAt":"","Id":"not an id","PromotionBoost":"high"}`,
		`{"PropertyObjectsAvailable":2147483647,"Payback":1e-999,"Title":null,"Status":null}`,
		`{"PropertyObjectsAvailable":12.0,"MinPrice":"-0.50","Title":"Tower","Visibility":"Visible"}`,
	} {
		r := b.do(t, "PUT", "/cards/projects/"+project, "feed", body)
		require.Equal(t, http.StatusOK, r.Status, "%s: %v", body, r.Body)
	}
	var card struct {
		Available int    `db:"property_objects_available"`
		MinPrice  string `db:"min_price"`
	}
	require.NoError(t, b.db.Get(&card, `SELECT property_objects_available, min_price::text AS min_price FROM catalog.project_cards WHERE id = $1`, project))
	require.Equal(t, 12, card.Available)
	require.Equal(t, "-0.50", card.MinPrice)

	read := b.do(t, "GET", "/cards/projects/"+project, "feed", nil)
	read.Body["Title"] = "Tower 2"
	require.Equal(t, http.StatusOK, b.do(t, "PUT", "/cards/projects/"+project, "feed", read.Body).Status, "a card read goes back as it is")
	require.Equal(t, http.StatusOK, b.do(t, "PUT", "/cards/property-objects/"+uuid.NewString(), "feed",
		`{"ProjectId":"`+strings.ToUpper(project)+`","Price":2400000,"UpdatedAt":"yesterday"}`).Status)
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

	again := b.do(t, "POST", "/admin/projections/rebuild", "admin", nil)
	require.Equal(t, http.StatusTooManyRequests, again.Status, "within the cooldown after the last start: %v", again.Body)
	require.Equal(t, "rebuild_cooldown", again.Body["code"])
	retry, err := strconv.Atoi(again.Header.Get("Retry-After"))
	require.NoError(t, err)
	require.Greater(t, retry, 3500, "Retry-After is when the hour's cooldown ends")
	require.Equal(t, r.Body["id"], b.do(t, "GET", "/admin/projections/rebuild", "admin", nil).Body["id"], "no rebuild was recorded")
}

// TestCards_AnonymousReadersSeeOnlyPublicCards: a reader with no token sees
// a project of Visibility Public and its published objects only; a private
// project, an unpublished object, or an object of a private project answers
// 404 as an absent card does (and a private project's list is empty). The
// feed's and the admin token see every card.
func TestCards_AnonymousReadersSeeOnlyPublicCards(t *testing.T) {
	b := setupCatalogAPI(t)
	public, private := uuid.NewString(), uuid.NewString()
	shown, hidden, ofPrivate := uuid.NewString(), uuid.NewString(), uuid.NewString()
	put := func(path string, body map[string]any) {
		t.Helper()
		r := b.do(t, "PUT", path, "feed", body)
		require.Equal(t, http.StatusOK, r.Status, r.Body)
	}
	put("/cards/projects/"+public, map[string]any{"Title": "Open", "Visibility": "Public", "MinPrice": 100})
	put("/cards/projects/"+private, map[string]any{"Title": "Closed", "Visibility": "Private", "MinPrice": 200})
	put("/cards/property-objects/"+shown, map[string]any{"ProjectId": public, "Published": true, "Price": 100})
	put("/cards/property-objects/"+hidden, map[string]any{"ProjectId": public, "Published": false, "Price": 150})
	put("/cards/property-objects/"+ofPrivate, map[string]any{"ProjectId": private, "Published": true, "Price": 200})

	for _, tc := range []struct {
		path   string
		status int
	}{
		{"/cards/projects/" + public, http.StatusOK},
		{"/cards/property-objects/" + shown, http.StatusOK},
		{"/cards/projects/" + private, http.StatusNotFound},
		{"/cards/property-objects/" + hidden, http.StatusNotFound},
		{"/cards/property-objects/" + ofPrivate, http.StatusNotFound},
	} {
		r := b.do(t, "GET", tc.path, "", nil)
		require.Equal(t, tc.status, r.Status, "anonymous GET %s: %v", tc.path, r.Body)
		if tc.status == http.StatusNotFound {
			require.Equal(t, "not_found", r.Body["code"], "answered as an absent card: %s", tc.path)
		}
		for _, token := range []string{"feed", "admin"} {
			require.Equal(t, http.StatusOK, b.do(t, "GET", tc.path, token, nil).Status, "%s token GET %s", token, tc.path)
		}
	}
	items := func(project, token string) []any {
		t.Helper()
		r := b.do(t, "GET", "/cards/projects/"+project+"/property-objects", token, nil)
		require.Equal(t, http.StatusOK, r.Status, r.Body)
		return r.Body["items"].([]any)
	}
	require.Len(t, items(public, ""), 1, "anonymous: the public project's published object only")
	require.Equal(t, shown, items(public, "")[0].(map[string]any)["Id"])
	require.Empty(t, items(private, ""), "anonymous: a private project lists nothing, as an absent one")
	require.Len(t, items(public, "feed"), 2, "the feed's token lists every object")
	require.Len(t, items(private, "admin"), 1, "the admin token lists every object")
}
