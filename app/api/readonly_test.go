package api_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/app/api"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestAPI_ReadOnlyDatabaseAnswers503: a database that takes no writes now (a
// hot standby, whose BEGIN READ WRITE fails with 0A000, and a database whose
// default_transaction_read_only is on, which lib/pq's BEGIN READ WRITE would
// override) answers create and cancel with 503, Retry-After and code
// read_only, and nothing is written; reads still answer. On the standby the
// catalog's card feed answers its writes the same way.
func TestAPI_ReadOnlyDatabaseAnswers503(t *testing.T) {
	t.Parallel()
	t.Run("hot standby", func(t *testing.T) {
		t.Parallel()
		primary := pgtest.StartServer(t, pgtest.ServerOptions{})
		url := pgtest.DatabaseURLOn(t, primary.URL("sslmode=disable"))
		writable := newPromotionAPIOn(t, pgtest.Open(t, url))
		id := createOne(t, writable)
		standby := primary.StartStandby(t, "s1")
		primary.WaitReplayed(t, standby)
		standbyURL := strings.Replace(url, fmt.Sprintf(":%d/", primary.Port), fmt.Sprintf(":%d/", standby.Port), 1)
		standbyDB := pgtest.OpenAsIs(t, standbyURL)
		requireReadOnlyAnswers(t, newPromotionAPIOn(t, standbyDB), id)

		// The catalog's card feed answers the same way.
		mux := http.NewServeMux()
		(&api.Catalog{DB: standbyDB, FeedToken: "admin", Log: slog.New(slog.DiscardHandler)}).Register(mux, http.NewServeMux())
		catalog := apiBundle{db: standbyDB, srv: validatedServer(t, catalogDocument, mux)}
		r := catalog.do(t, "PUT", "/cards/projects/"+uuid.NewString(), "admin", map[string]any{"Title": "Tower"})
		require.Equal(t, http.StatusServiceUnavailable, r.Status, r.Body)
		require.Equal(t, "read_only", r.Body["code"])
		require.NotEmpty(t, r.Header.Get("Retry-After"))
	})
	t.Run("default_transaction_read_only", func(t *testing.T) {
		t.Parallel()
		url := pgtest.DatabaseURL(t)
		db := pgtest.Open(t, url)
		id := createOne(t, newPromotionAPIOn(t, db))
		var name string
		require.NoError(t, db.Get(&name, `SELECT current_database()`))
		_, err := db.Exec(`ALTER DATABASE ` + name + ` SET default_transaction_read_only = on`)
		require.NoError(t, err)
		requireReadOnlyAnswers(t, newPromotionAPIOn(t, pgtest.OpenAsIs(t, url)), id)
	})
}

// requireReadOnlyAnswers checks that b's create and cancel of id answer 503
// read_only with Retry-After and write nothing.
func requireReadOnlyAnswers(t *testing.T, b apiBundle, id string) {
	t.Helper()
	purchases, events := b.counts(t)
	for name, r := range map[string]reply{
		"create": b.do(t, "POST", "/promotions", "token-a", validBody()),
		"cancel": b.do(t, "POST", "/promotions/"+id+"/cancel", "token-a", nil),
	} {
		require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s: %v", name, r.Body)
		require.Equal(t, "read_only", r.Body["code"], name)
		require.NotEmpty(t, r.Header.Get("Retry-After"), name)
	}
	p, e := b.counts(t)
	require.Equal(t, []int{purchases, events}, []int{p, e}, "purchases and outbox events written")
	r := b.do(t, "GET", "/promotions/"+id, "token-a", nil)
	require.Equal(t, http.StatusOK, r.Status, "a read answers: %v", r.Body)
	require.Equal(t, "Active", r.Body["Status"], "the cancel changed nothing")
}

// createOne creates a purchase of tenant A through b and returns its id.
func createOne(t *testing.T, b apiBundle) string {
	t.Helper()
	r := b.do(t, "POST", "/promotions", "token-a", validBody())
	require.Equal(t, http.StatusCreated, r.Status, r.Body)
	return r.Body["Id"].(string)
}

// newPromotionAPIOn serves the purchase API on db, every exchange checked
// against the OpenAPI document.
func newPromotionAPIOn(t *testing.T, db *sqlx.DB) apiBundle {
	t.Helper()
	mux := http.NewServeMux()
	(&api.Promotions{
		Service: purchasetest.NewService(t, db, ""),
		Tokens:  api.NewTokens(map[string]uuid.UUID{"token-a": tenantA, "token-b": tenantB}),
		Log:     slog.New(slog.DiscardHandler),
	}).Register(mux)
	return apiBundle{db: db, srv: validatedServer(t, promotionDocument, mux)}
}
