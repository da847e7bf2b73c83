package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/app/api"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/purchase"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

var (
	tenantA = uuid.MustParse("aaaaaaaa-0000-4000-8000-000000000001")
	tenantB = uuid.MustParse("bbbbbbbb-0000-4000-8000-000000000002")
)

type apiBundle struct {
	db  *sqlx.DB
	srv *httptest.Server
	// internal serves /admin (the internal listener), when the API has any.
	internal *httptest.Server
}

func setup(t *testing.T) apiBundle {
	t.Helper()
	t.Parallel()
	return newPromotionAPI(t)
}

// newPromotionAPI serves the purchase API on a database of its own, every
// exchange checked against the OpenAPI document.
func newPromotionAPI(t *testing.T) apiBundle {
	t.Helper()
	return newPromotionAPIOn(t, pgtest.DB(t))
}

type reply struct {
	Status int
	Header http.Header
	Body   map[string]any
}

func (b apiBundle) do(t *testing.T, method, path, token string, body any, headers ...string) reply {
	t.Helper()
	var rd *bytes.Reader
	switch v := body.(type) {
	case nil:
		rd = bytes.NewReader(nil)
	case string:
		rd = bytes.NewReader([]byte(v))
	default:
		raw, err := json.Marshal(v)
		require.NoError(t, err)
		rd = bytes.NewReader(raw)
	}
	base := b.srv.URL
	if b.internal != nil && strings.HasPrefix(path, "/admin/") {
		base = b.internal.URL
	}
	req, err := http.NewRequest(method, base+path, rd)
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out := reply{Status: resp.StatusCode, Header: resp.Header, Body: map[string]any{}}
	_ = json.NewDecoder(resp.Body).Decode(&out.Body)
	return out
}

func validBody() map[string]any {
	return map[string]any{
		"PackageKind": "Top",
		"Targets":     []map[string]string{{"TargetKind": "Project", "TargetId": uuid.NewString()}},
		"BoostWeight": 30,
		"EndsAt":      time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339),
	}
}

func (b apiBundle) counts(t *testing.T) (purchases, events int) {
	require.NoError(t, b.db.Get(&purchases, `SELECT count(*) FROM promotion.promotion_purchases`))
	require.NoError(t, b.db.Get(&events, `SELECT count(*) FROM promotion.outbox_messages`))
	return
}

func TestAPI_CreateIsActiveAtOnceWithItsEventInTheOutbox(t *testing.T) {
	b := setup(t)
	r := b.do(t, "POST", "/promotions", "token-a", validBody())
	require.Equal(t, http.StatusCreated, r.Status, r.Body)
	require.Equal(t, "Active", r.Body["Status"])
	require.Equal(t, "NotRequired", r.Body["PaymentStatus"])
	require.EqualValues(t, 1, r.Body["Version"])
	require.Equal(t, tenantA.String(), r.Body["TenantId"])

	evs := purchasetest.OutboxEvents(t, b.db)
	require.Len(t, evs, 1)
	require.Equal(t, event.StatusActive, evs[0].Status)
	require.Equal(t, r.Body["Id"], evs[0].PurchaseId.String())

	stored, err := purchase.Get(context.Background(), b.db, tenantA, evs[0].PurchaseId)
	require.NoError(t, err)
	require.Equal(t, stored.Event(), evs[0], "the event is the stored snapshot, to the microsecond")
}

func TestAPI_BadInputGetsClearErrorAndWritesNothing(t *testing.T) {
	b := setup(t)
	with := func(k string, v any) map[string]any { m := validBody(); m[k] = v; return m }
	cases := map[string]struct {
		body   any
		status int
		code   string
	}{
		"malformed json":    {`{"PackageKind":`, 400, "malformed_json"},
		"unknown field":     {with("Discount", 5), 400, "malformed_json"},
		"bad target uuid":   {with("Targets", []map[string]string{{"TargetKind": "Project", "TargetId": "nope"}}), 400, "malformed_json"},
		"empty targets":     {with("Targets", []any{}), 422, "validation_failed"},
		"unknown kind":      {with("Targets", []map[string]string{{"TargetKind": "Shop", "TargetId": uuid.NewString()}}), 422, "validation_failed"},
		"nil target id":     {with("Targets", []map[string]string{{"TargetKind": "Post", "TargetId": uuid.Nil.String()}}), 422, "validation_failed"},
		"weight zero":       {with("BoostWeight", 0), 422, "validation_failed"},
		"weight 101":        {with("BoostWeight", 101), 422, "validation_failed"},
		"ends before start": {with("StartsAt", time.Now().Add(48*time.Hour).UTC().Format(time.RFC3339)), 422, "validation_failed"},
		"no ends at":        {with("EndsAt", nil), 422, "validation_failed"},
		"no package kind":   {with("PackageKind", ""), 422, "validation_failed"},
		// What the document refuses, whichever way encoding/json alone would read it.
		"null body":                 {"null", 422, "not_an_object"},
		"array body":                {"[]", 422, "not_an_object"},
		"text after the object":     {`{"PackageKind":"Top"} {}`, 400, "malformed_json"},
		"member in another case":    {with("packagekind", "Top"), 400, "malformed_json"},
		"id without hyphens":        {with("Targets", []map[string]string{{"TargetKind": "Post", "TargetId": "0b1e1c4e5d6f4a7b8c9d0e1f2a3b4c5d"}}), 400, "malformed_json"},
		"leap second":               {with("EndsAt", "2099-12-31T23:59:60Z"), 400, "malformed_json"},
		"offset of 24 hours":        {with("EndsAt", "2099-12-31T00:00:00+24:00"), 400, "malformed_json"},
		"lower-case t":              {with("EndsAt", "2099-12-31t00:00:00Z"), 400, "malformed_json"},
		"fractional weight":         {with("BoostWeight", 30.5), 400, "malformed_json"},
		"weight beyond int64":       {with("BoostWeight", 1e30), 422, "validation_failed"},
		"blank package kind":        {with("PackageKind", " \t "), 422, "validation_failed"},
		"U+0000 in package kind":    {with("PackageKind", "To\u0000p"), 422, "validation_failed"},
		"package kind of 65 runes":  {with("PackageKind", strings.Repeat("é", 65)), 422, "validation_failed"},
		"starts when it ends":       {with("StartsAt", validBody()["EndsAt"]), 422, "validation_failed"},
		"starts at the zero time":   {with("StartsAt", "0001-01-01T00:00:00Z"), 422, "validation_failed"},
		"ends at the zero instant":  {with("EndsAt", "0001-01-01T01:00:00+01:00"), 422, "validation_failed"},
		"ends after year 9999":      {with("EndsAt", "9999-12-31T23:00:00-01:00"), 422, "validation_failed"},
		"duplicate in another case": {with("Targets", []map[string]string{{"TargetKind": "Post", "TargetId": "0b1e1c4e-5d6f-4a7b-8c9d-0e1f2a3b4c5d"}, {"TargetKind": "Post", "TargetId": "0B1E1C4E-5D6F-4A7B-8C9D-0E1F2A3B4C5D"}}), 422, "validation_failed"},
	}
	for name, tc := range cases {
		r := b.do(t, "POST", "/promotions", "token-a", tc.body)
		require.Equal(t, tc.status, r.Status, name)
		require.Equal(t, api.ProblemContentType, r.Header.Get("Content-Type"), name)
		require.EqualValues(t, tc.status, r.Body["status"], "%s: a problem details body", name)
		require.Equal(t, tc.code, r.Body["code"], name)
		require.NotEmpty(t, r.Body["detail"], name)
	}
	for name, key := range map[string]string{"non-ASCII": "clé", "a tab inside": "a\tb", "256 characters": strings.Repeat("k", 256)} {
		r := b.do(t, "POST", "/promotions", "token-a", validBody(), "Idempotency-Key", key)
		require.Equal(t, http.StatusBadRequest, r.Status, "Idempotency-Key %s", name)
		require.Equal(t, "invalid_idempotency_key", r.Body["code"], name)
	}
	p, e := b.counts(t)
	require.Zero(t, p)
	require.Zero(t, e)

	r := b.do(t, "POST", "/promotions", "token-a", with("BoostWeight", 0))
	fields := r.Body["fields"].([]any)
	require.Equal(t, "BoostWeight", fields[0].(map[string]any)["field"])
}

// TestAPI_CreateAcceptsEveryFormTheDocumentAllows: a whole number written
// 30.0 or 3e1 is an integer, an offset and a fraction are RFC 3339, 64
// characters are 64 whatever their bytes, and a UUID may be in capitals.
func TestAPI_CreateAcceptsEveryFormTheDocumentAllows(t *testing.T) {
	b := setup(t)
	for name, body := range map[string]string{
		"weight 30.0":         `{"PackageKind":"Top","Targets":[{"TargetKind":"Post","TargetId":"%s"}],"BoostWeight":30.0,"EndsAt":"2099-01-01T00:00:00Z"}`,
		"weight 3e1":          `{"PackageKind":"Top","Targets":[{"TargetKind":"Post","TargetId":"%s"}],"BoostWeight":3e1,"EndsAt":"2099-01-01T00:00:00Z"}`,
		"offset and fraction": `{"PackageKind":"Top","Targets":[{"TargetKind":"Post","TargetId":"%s"}],"BoostWeight":1,"StartsAt":"2026-01-01T05:30:00.123456+05:30","EndsAt":"2099-01-01T00:00:00.5-08:00"}`,
		"64 two-byte runes":   `{"PackageKind":"` + strings.Repeat("é", 64) + `","Targets":[{"TargetKind":"Post","TargetId":"%s"}],"BoostWeight":1,"EndsAt":"2099-01-01T00:00:00Z"}`,
		"blank but not ASCII": `{"PackageKind":"　","Targets":[{"TargetKind":"Post","TargetId":"%s"}],"BoostWeight":1,"EndsAt":"2099-01-01T00:00:00Z"}`,
		"UUID in capitals":    `{"PackageKind":"Top","Targets":[{"TargetKind":"Post","TargetId":"%s"}],"BoostWeight":1,"EndsAt":"2099-01-01T00:00:00Z","StartsAt":null}`,
	} {
		id := uuid.NewString()
		if name == "UUID in capitals" {
			id = strings.ToUpper(id)
		}
		r := b.do(t, "POST", "/promotions", "token-a", fmt.Sprintf(body, id), "Idempotency-Key", "printable ~ ASCII "+name)
		require.Equal(t, http.StatusCreated, r.Status, "%s: %v", name, r.Body)
	}
	p, _ := b.counts(t)
	require.Equal(t, 6, p)
}

func TestAPI_UnknownTokenIsUnauthorized(t *testing.T) {
	b := setup(t)
	require.Equal(t, http.StatusUnauthorized, b.do(t, "POST", "/promotions", "", validBody()).Status)
	require.Equal(t, http.StatusUnauthorized, b.do(t, "GET", "/promotions", "forged", nil).Status)
	p, _ := b.counts(t)
	require.Zero(t, p)
}

func TestAPI_AnotherTenantsPurchaseAnswers404(t *testing.T) {
	b := setup(t)
	created := b.do(t, "POST", "/promotions", "token-a", validBody())
	id := created.Body["Id"].(string)

	require.Equal(t, http.StatusOK, b.do(t, "GET", "/promotions/"+id, "token-a", nil).Status)
	require.Equal(t, http.StatusNotFound, b.do(t, "GET", "/promotions/"+id, "token-b", nil).Status)
	require.Equal(t, http.StatusNotFound, b.do(t, "POST", "/promotions/"+id+"/cancel", "token-b", nil).Status)
	require.Equal(t, http.StatusBadRequest, b.do(t, "GET", "/promotions/not-a-uuid", "token-a", nil).Status)

	listB := b.do(t, "GET", "/promotions", "token-b", nil)
	require.Empty(t, listB.Body["items"])
	listA := b.do(t, "GET", "/promotions?status=Active", "token-a", nil)
	require.Len(t, listA.Body["items"], 1)
	require.Equal(t, "Active", b.do(t, "GET", "/promotions/"+id, "token-a", nil).Body["Status"], "B's cancel changed nothing")
}

func TestAPI_ListFiltersByStatus(t *testing.T) {
	b := setup(t)
	for range 3 {
		b.do(t, "POST", "/promotions", "token-a", validBody())
	}
	id := b.do(t, "GET", "/promotions", "token-a", nil).Body["items"].([]any)[0].(map[string]any)["Id"].(string)
	require.Equal(t, http.StatusOK, b.do(t, "POST", "/promotions/"+id+"/cancel", "token-a", nil).Status)
	require.Len(t, b.do(t, "GET", "/promotions?status=Active", "token-a", nil).Body["items"], 2)
	require.Len(t, b.do(t, "GET", "/promotions?status=Cancelled", "token-a", nil).Body["items"], 1)
	require.Equal(t, http.StatusBadRequest, b.do(t, "GET", "/promotions?status=Paused", "token-a", nil).Status)
	require.Equal(t, http.StatusBadRequest, b.do(t, "GET", "/promotions?limit=0", "token-a", nil).Status)
	// An empty value is not the parameter left out: the document's enum and integer refuse it.
	require.Equal(t, "invalid_status", b.do(t, "GET", "/promotions?status=", "token-a", nil).Body["code"])
	require.Equal(t, "invalid_limit", b.do(t, "GET", "/promotions?limit=", "token-a", nil).Body["code"])
}

func TestAPI_IdempotencyKeyReturnsTheFirstPurchase(t *testing.T) {
	b := setup(t)
	body := validBody()
	first := b.do(t, "POST", "/promotions", "token-a", body, "Idempotency-Key", "k-1")
	require.Equal(t, http.StatusCreated, first.Status)
	again := b.do(t, "POST", "/promotions", "token-a", body, "Idempotency-Key", "k-1")
	require.Equal(t, http.StatusOK, again.Status)
	require.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	require.Equal(t, first.Body["Id"], again.Body["Id"])

	other := validBody()
	reused := b.do(t, "POST", "/promotions", "token-a", other, "Idempotency-Key", "k-1")
	require.Equal(t, http.StatusUnprocessableEntity, reused.Status)
	require.Equal(t, "idempotency_key_reused", reused.Body["code"])

	// The same key of another tenant is another key.
	require.Equal(t, http.StatusCreated, b.do(t, "POST", "/promotions", "token-b", body, "Idempotency-Key", "k-1").Status)

	p, e := b.counts(t)
	require.Equal(t, 2, p)
	require.Equal(t, 2, e)
}

func TestAPI_ConcurrentRequestsWithOneIdempotencyKeyCreateOnePurchase(t *testing.T) {
	b := setup(t)
	body := validBody()
	var wg sync.WaitGroup
	ids := make(chan any, 10)
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := b.do(t, "POST", "/promotions", "token-a", body, "Idempotency-Key", "same")
			ids <- r.Body["Id"]
		}()
	}
	wg.Wait()
	close(ids)
	distinct := map[any]bool{}
	for id := range ids {
		distinct[id] = true
	}
	require.Len(t, distinct, 1)
	p, e := b.counts(t)
	require.Equal(t, 1, p)
	require.Equal(t, 1, e)
}

func TestAPI_CancelMovesActiveToCancelledOnce(t *testing.T) {
	b := setup(t)
	id := b.do(t, "POST", "/promotions", "token-a", validBody()).Body["Id"].(string)
	r := b.do(t, "POST", "/promotions/"+id+"/cancel", "token-a", nil)
	require.Equal(t, http.StatusOK, r.Status)
	require.Equal(t, "Cancelled", r.Body["Status"])
	require.EqualValues(t, 2, r.Body["Version"])

	again := b.do(t, "POST", "/promotions/"+id+"/cancel", "token-a", nil)
	require.Equal(t, http.StatusConflict, again.Status)
	require.Contains(t, again.Body["detail"], "Cancelled")

	evs := purchasetest.OutboxEvents(t, b.db)
	require.Len(t, evs, 2)
	require.Equal(t, event.StatusCancelled, evs[1].Status)
	require.Equal(t, http.StatusNotFound, b.do(t, "POST", "/promotions/"+uuid.NewString()+"/cancel", "token-a", nil).Status)
}

// TestAPI_CancelRacingTheExpirerEndsInOneTerminalTransition: a manager
// cancels due purchases through the API, newest first, while expiry cycles
// take them oldest first, so that the two meet. Whoever wins a purchase, it
// has one terminal transition and one terminal event, and the cancel answers
// 200 exactly when it won. Rounds of fresh purchases run until each side won
// at least once (at most raceRounds), so that the race really happened.
func TestAPI_CancelRacingTheExpirerEndsInOneTerminalTransition(t *testing.T) {
	b := setup(t)
	exp, err := expire.New(b.db, expire.Config{BatchSize: 5}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	const raceRounds = 10
	var cancelWins, expireWins int
	for round := 0; round < raceRounds && (cancelWins == 0 || expireWins == 0); round++ {
		c, e := b.cancelRaceRound(t, exp)
		cancelWins, expireWins = cancelWins+c, expireWins+e
		t.Logf("round %d: cancel won %d, expirer won %d", round, c, e)
	}
	require.Positive(t, cancelWins, "no cancel won a purchase in %d rounds: the race never happened", raceRounds)
	require.Positive(t, expireWins, "the expirer won no purchase in %d rounds: the race never happened", raceRounds)
}

// cancelRaceRound creates 60 purchases that are due already, races their
// cancels against expiry cycles, checks each purchase, and returns how many
// each side won.
func (b apiBundle) cancelRaceRound(t *testing.T, exp *expire.Expirer) (cancelWins, expireWins int) {
	t.Helper()
	const n = 60
	ids := make([]string, n)
	for i := range ids {
		body := validBody()
		body["StartsAt"] = time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano)
		body["EndsAt"] = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
		r := b.do(t, "POST", "/promotions", "token-a", body)
		require.Equal(t, http.StatusCreated, r.Status, r.Body)
		ids[i] = r.Body["Id"].(string)
	}

	var wg sync.WaitGroup
	codes := make([]int, n)
	wg.Go(func() {
		for i := n - 1; i >= 0; i-- {
			codes[i] = b.do(t, "POST", "/promotions/"+ids[i]+"/cancel", "token-a", nil).Status
		}
	})
	wg.Go(func() {
		for range 100 {
			res, err := exp.RunCycle(context.Background())
			if err != nil {
				t.Errorf("cycle: %v", err)
				return
			}
			if res.Backlog == 0 && res.SkippedLockedCount == 0 {
				return
			}
		}
	})
	wg.Wait()

	events := map[string][]event.PurchaseChanged{}
	for _, ev := range purchasetest.OutboxEvents(t, b.db) {
		events[ev.PurchaseId.String()] = append(events[ev.PurchaseId.String()], ev)
	}
	for i, id := range ids {
		got := b.do(t, "GET", "/promotions/"+id, "token-a", nil).Body
		status := got["Status"].(string)
		require.Contains(t, []string{"Cancelled", "Expired"}, status)
		require.EqualValues(t, 2, got["Version"], "one terminal transition")
		require.Len(t, events[id], 2, "Active, then exactly one terminal event")
		require.Equal(t, status, string(events[id][1].Status))
		if codes[i] == http.StatusOK {
			require.Equal(t, "Cancelled", status)
			cancelWins++
		} else {
			require.Equal(t, http.StatusConflict, codes[i], fmt.Sprintf("cancel of %s", id))
			require.Equal(t, "Expired", status)
			expireWins++
		}
	}
	return cancelWins, expireWins
}
