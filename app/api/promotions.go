package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/purchase"
)

// maxBody bounds a request body.
const maxBody = 64 << 10

// Promotions serves the purchase API.
type Promotions struct {
	Service *purchase.Service
	Tokens  Tokens
	Log     *slog.Logger
}

// Register mounts the routes on mux, and the API's OpenAPI document at GET /openapi.json.
func (h *Promotions) Register(mux *http.ServeMux) {
	serveDocument(mux, promotionDocument)
	mux.HandleFunc("POST /promotions", h.Tokens.authenticate(h.create))
	mux.HandleFunc("GET /promotions", h.Tokens.authenticate(h.list))
	mux.HandleFunc("GET /promotions/{id}", h.Tokens.authenticate(h.get))
	mux.HandleFunc("POST /promotions/{id}/cancel", h.Tokens.authenticate(h.cancel))
}

type createRequest struct {
	PackageKind string         `json:"PackageKind"`
	Targets     []event.Target `json:"Targets"`
	BoostWeight int            `json:"BoostWeight"`
	StartsAt    *time.Time     `json:"StartsAt"`
	EndsAt      *time.Time     `json:"EndsAt"`
}

func (h *Promotions) create(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "malformed_json", "request body is not a valid purchase: "+err.Error())
		return
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "malformed_json", "request body must hold one JSON object")
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if len(key) > 255 {
		writeError(w, http.StatusBadRequest, "invalid_idempotency_key", "Idempotency-Key is longer than 255 characters")
		return
	}
	d := purchase.Draft{PackageKind: req.PackageKind, Targets: req.Targets, BoostWeight: req.BoostWeight}
	if req.StartsAt != nil {
		d.StartsAt = *req.StartsAt
	}
	if req.EndsAt != nil {
		d.EndsAt = *req.EndsAt
	}
	p, replayed, err := h.Service.Create(r.Context(), tenantOf(r), key, d, correlationID(r))
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
	status := event.Status(r.URL.Query().Get("status"))
	if status != "" && !status.Valid() {
		writeError(w, http.StatusBadRequest, "invalid_status", fmt.Sprintf("status %q is not one of Pending, Active, Expired, Cancelled", status))
		return
	}
	limit := 100
	if raw := r.URL.Query().Get("limit"); raw != "" {
		n, err := strconv.Atoi(raw)
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
	p, err := h.Service.Cancel(r.Context(), tenantOf(r), id, correlationID(r))
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
	case unavailable(err):
		h.Log.Warn("purchase api: database unavailable", "method", r.Method, "path", r.URL.Path, "error", err.Error())
		writeUnavailable(w)
	default:
		h.Log.Error("purchase api failed", "method", r.Method, "path", r.URL.Path, "error", err.Error())
		writeError(w, http.StatusInternalServerError, "internal", "internal error")
	}
}

func pathID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_id", "purchase id must be a UUID")
		return uuid.Nil, false
	}
	return id, true
}

// correlationID takes X-Correlation-Id from the caller or makes one.
func correlationID(r *http.Request) string {
	if c := r.Header.Get("X-Correlation-Id"); c != "" && len(c) <= 128 {
		return c
	}
	return uuid.NewString()
}
