package api

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"

	"github.com/google/uuid"

	"github.com/promoflow/promoflow/handlers/dberr"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/purchase"
)

// Promotions serves the purchase API.
type Promotions struct {
	Service *purchase.Service
	Tokens  Tokens
	// RateLimit bounds each tenant's calls (429 beyond it).
	RateLimit RateLimit
	Log       *slog.Logger
}

// Register mounts the routes on mux, and the API's OpenAPI document at GET /openapi.json.
func (h *Promotions) Register(mux *http.ServeMux) {
	serveDocument(mux, promotionDocument)
	lim := newLimiters(h.RateLimit)
	mux.HandleFunc("POST /promotions", h.Tokens.authenticate(lim, h.create))
	mux.HandleFunc("GET /promotions", h.Tokens.authenticate(lim, h.list))
	mux.HandleFunc("GET /promotions/{id}", h.Tokens.authenticate(lim, h.get))
	mux.HandleFunc("POST /promotions/{id}/cancel", h.Tokens.authenticate(lim, h.cancel))
}

// createRequest is the body of POST /promotions (schema CreatePurchase).
type createRequest struct {
	PackageKind text            `json:"PackageKind"`
	Targets     []targetRequest `json:"Targets"`
	BoostWeight integer         `json:"BoostWeight"`
	StartsAt    *dateTime       `json:"StartsAt"`
	EndsAt      *dateTime       `json:"EndsAt"`
}

// targetRequest is one of its Targets (schema Target).
type targetRequest struct {
	TargetKind event.TargetKind `json:"TargetKind"`
	TargetId   canonicalUUID    `json:"TargetId"`
}

func (t *targetRequest) UnmarshalJSON(b []byte) error {
	type members targetRequest // without this method
	return strictUnmarshal(b, (*members)(t))
}

// zeroInstants names a StartsAt or EndsAt given as 0001-01-01T00:00:00Z in
// UTC: a Draft's zero time stands for none given, so that instant would turn
// into now (StartsAt) or a missing EndsAt.
func (req createRequest) zeroInstants() []FieldError {
	var fields []FieldError
	for _, f := range []struct {
		name string
		t    *dateTime
	}{{"StartsAt", req.StartsAt}, {"EndsAt", req.EndsAt}} {
		if f.t != nil && f.t.time().IsZero() {
			fields = append(fields, FieldError{Field: f.name, Problem: "must be after 0001-01-01T00:00:00Z, which stands for none"})
		}
	}
	return fields
}

func (req createRequest) draft() purchase.Draft {
	targets := make([]event.Target, len(req.Targets))
	for i, t := range req.Targets {
		targets[i] = event.Target{TargetKind: t.TargetKind, TargetId: uuid.UUID(t.TargetId)}
	}
	return purchase.Draft{PackageKind: string(req.PackageKind), Targets: targets, BoostWeight: int(req.BoostWeight),
		StartsAt: req.StartsAt.time(), EndsAt: req.EndsAt.time()}
}

// idempotencyKey is the Idempotency-Key header: printable ASCII, as a
// Structured Field string is, so that PostgreSQL text holds it as sent.
func idempotencyKey(r *http.Request) (string, error) {
	key := r.Header.Get("Idempotency-Key")
	if len(key) > 255 {
		return "", errors.New("Idempotency-Key is longer than 255 characters")
	}
	for i := range len(key) {
		if key[i] < ' ' || key[i] > '~' {
			return "", errors.New("Idempotency-Key holds a character that is not printable ASCII")
		}
	}
	return key, nil
}

func (h *Promotions) create(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if !decodeBody(w, r, &req) {
		return
	}
	key, err := idempotencyKey(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_idempotency_key", err.Error())
		return
	}
	if fields := req.zeroInstants(); len(fields) > 0 {
		writeError(w, http.StatusUnprocessableEntity, "validation_failed", "the purchase is not valid", fields...)
		return
	}
	d := req.draft()
	p, replayed, err := h.Service.Create(r.Context(), tenantOf(r), key, d, h.correlationID(r))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	status := http.StatusCreated
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
		status = http.StatusOK
	}
	w.Header().Set("Location", "/promotions/"+p.ID.String())
	writeJSON(w, status, p)
}

func (h *Promotions) get(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	p, err := h.Service.Get(r.Context(), tenantOf(r), id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

func (h *Promotions) list(w http.ResponseWriter, r *http.Request) {
	query := r.URL.Query()
	status := event.Status(query.Get("status"))
	if _, given := query["status"]; given && !status.Valid() {
		writeError(w, http.StatusBadRequest, "invalid_status", fmt.Sprintf("status %q is not one of Pending, Active, Expired, Cancelled", status))
		return
	}
	limit := 100
	if _, given := query["limit"]; given {
		n, err := strconv.Atoi(query.Get("limit"))
		if err != nil || n < 1 || n > 1000 {
			writeError(w, http.StatusBadRequest, "invalid_limit", "limit must be a whole number within 1..1000")
			return
		}
		limit = n
	}
	ps, err := h.Service.List(r.Context(), tenantOf(r), status, limit)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if ps == nil {
		ps = []purchase.Purchase{}
	}
	writeJSON(w, http.StatusOK, map[string][]purchase.Purchase{"items": ps})
}

func (h *Promotions) cancel(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	p, err := h.Service.Cancel(r.Context(), tenantOf(r), id, h.correlationID(r))
	if errors.Is(err, purchase.ErrTerminal) {
		writeError(w, http.StatusConflict, "terminal_status", fmt.Sprintf("purchase is already %s", p.Status))
		return
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

func (h *Promotions) fail(w http.ResponseWriter, r *http.Request, err error) {
	var ve *purchase.ValidationError
	switch {
	case errors.As(err, &ve):
		fields := make([]FieldError, len(ve.Fields))
		for i, f := range ve.Fields {
			fields[i] = FieldError{Field: f.Field, Problem: f.Problem}
		}
		writeError(w, http.StatusUnprocessableEntity, "validation_failed", "the purchase is not valid", fields...)
	case errors.Is(err, purchase.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", "no such purchase")
	case errors.Is(err, purchase.ErrIdempotencyKeyReused):
		writeError(w, http.StatusUnprocessableEntity, "idempotency_key_reused", err.Error())
	case errors.Is(err, purchase.ErrIdempotencyKeyExpired):
		writeError(w, http.StatusConflict, "idempotency_key_expired", err.Error())
	case errors.Is(err, purchase.ErrVersionConflict):
		writeError(w, http.StatusConflict, "version_conflict", "the purchase changed meanwhile; read it again")
	case r.Context().Err() != nil:
		writeError(w, http.StatusServiceUnavailable, "cancelled", "the request was cancelled")
	case dberr.ReadOnly(err):
		h.Log.Warn("purchase api: the database takes no writes", "method", r.Method, "path", r.URL.Path, "error", err.Error())
		writeReadOnly(w)
	case unavailable(err):
		h.Log.Warn("purchase api: database unavailable", "method", r.Method, "path", r.URL.Path, "error", err.Error())
		writeUnavailable(w)
	default:
		h.Log.Error("purchase api failed", "method", r.Method, "path", r.URL.Path, "error", err.Error())
		writeError(w, http.StatusInternalServerError, "internal", "internal error")
	}
}

func pathID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := parseID(r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_id", "the path's id must be a UUID")
		return uuid.Nil, false
	}
	return id, true
}

// correlationIDPattern is what a caller's X-Correlation-Id may be: it is
// published as the correlation_id header of every event the request writes
// (a string in the AsyncAPI), logged and put on spans.
var correlationIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// ValidCorrelationID reports whether c may be taken as a correlation id:
// 1 to 128 of A–Z, a–z, 0–9, '.', '_', ':' and '-'.
func ValidCorrelationID(c string) bool { return correlationIDPattern.MatchString(c) }

// correlationID takes X-Correlation-Id from the caller when it is valid, and
// otherwise makes one. A rejected one is dropped: only its length is logged,
// since its bytes are the caller's and may not even be text.
func (h *Promotions) correlationID(r *http.Request) string {
	c := r.Header.Get("X-Correlation-Id")
	if ValidCorrelationID(c) {
		return c
	}
	if c != "" {
		h.Log.Debug("purchase api: X-Correlation-Id is not valid and is replaced", "length", len(c))
	}
	return uuid.NewString()
}
