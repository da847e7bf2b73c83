package api

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/dberr"
	"github.com/promoflow/promoflow/router/bounded"
	"github.com/promoflow/promoflow/router/rebuild"
)

// Catalog serves the card feed (as the chessboard context would call it), the
// card reads and the projection rebuild.
type Catalog struct {
	DB *sqlx.DB
	// AdminToken guards the feed and the rebuild. Empty refuses them all.
	AdminToken string
	// Rebuilder runs the projection rebuild; the process stops it at exit.
	Rebuilder *rebuild.Rebuilder
	// RateLimit bounds the admin token's calls (429 beyond it).
	RateLimit RateLimit
	Log       *slog.Logger

	adminLimit *limiters
}

// Register mounts the routes on mux, and the API's OpenAPI document at GET /openapi.json.
func (h *Catalog) Register(mux *http.ServeMux) {
	serveDocument(mux, catalogDocument)
	h.adminLimit = newLimiters(h.RateLimit)
	mux.HandleFunc("PUT /cards/projects/{id}", h.admin(h.putProject))
	mux.HandleFunc("PUT /cards/property-objects/{id}", h.admin(h.putObject))
	mux.HandleFunc("GET /cards/projects/{id}", read(h, boost.GetProjectCard, projectView))
	mux.HandleFunc("GET /cards/projects/{id}/property-objects", h.listObjects)
	mux.HandleFunc("GET /cards/property-objects/{id}", read(h, boost.GetPropertyObjectCard, objectView))
	mux.HandleFunc("POST /admin/projections/rebuild", h.admin(h.startRebuild))
	mux.HandleFunc("GET /admin/projections/rebuild", h.admin(h.rebuildStatus))
}

func (h *Catalog) admin(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || h.AdminToken == "" || subtle.ConstantTimeCompare([]byte(token), []byte(h.AdminToken)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="promoflow-admin"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", "the admin bearer token is required")
			return
		}
		if ok, wait := h.adminLimit.allow("admin"); !ok {
			writeTooMany(w, wait)
			return
		}
		next(w, r)
	}
}

// ProjectCard is the JSON form of a project card.
type ProjectCard struct {
	Id                       uuid.UUID    `json:"Id"`
	Title                    string       `json:"Title"`
	Status                   string       `json:"Status"`
	Visibility               string       `json:"Visibility"`
	MinPrice                 *json.Number `json:"MinPrice"`
	PropertyObjectsAvailable int          `json:"PropertyObjectsAvailable"`
	Payback                  *json.Number `json:"Payback"`
	PromotionBoost           int          `json:"PromotionBoost"`
	UpdatedAt                *time.Time   `json:"UpdatedAt,omitempty"`
}

// PropertyObjectCard is the JSON form of a property-object card.
type PropertyObjectCard struct {
	Id             uuid.UUID    `json:"Id"`
	ProjectId      uuid.UUID    `json:"ProjectId"`
	Published      bool         `json:"Published"`
	Status         string       `json:"Status"`
	Price          *json.Number `json:"Price"`
	PromotionBoost int          `json:"PromotionBoost"`
	UpdatedAt      *time.Time   `json:"UpdatedAt,omitempty"`
}

func strNum(s *string) *json.Number {
	if s == nil {
		return nil
	}
	n := json.Number(*s)
	return &n
}

func projectView(c boost.ProjectCard) ProjectCard {
	return ProjectCard{Id: c.ID, Title: c.Title, Status: c.Status, Visibility: c.Visibility, MinPrice: strNum(c.MinPrice),
		PropertyObjectsAvailable: c.PropertyObjectsAvailable, Payback: strNum(c.Payback), PromotionBoost: c.PromotionBoost, UpdatedAt: &c.UpdatedAt}
}

func objectView(c boost.PropertyObjectCard) PropertyObjectCard {
	return PropertyObjectCard{Id: c.ID, ProjectId: c.ProjectID, Published: c.Published, Status: c.Status,
		Price: strNum(c.Price), PromotionBoost: c.PromotionBoost, UpdatedAt: &c.UpdatedAt}
}

// write runs fn in one transaction and answers its result.
func (h *Catalog) write(w http.ResponseWriter, r *http.Request, fn func(context.Context, *sqlx.Tx) (any, error)) {
	tx, err := h.DB.BeginTxx(r.Context(), nil)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out, err := fn(r.Context(), tx)
	if err != nil {
		_ = tx.Rollback()
		h.fail(w, r, err)
		return
	}
	if err := tx.Commit(); err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// read answers one card, read by get and shown by view.
func read[C, V any](h *Catalog, get func(context.Context, sqlx.QueryerContext, uuid.UUID) (C, error), view func(C) V) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, ok := pathID(w, r)
		if !ok {
			return
		}
		c, err := get(r.Context(), h.DB, id)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, view(c))
	}
}

func (h *Catalog) listObjects(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	cs, err := boost.ListPropertyObjectCards(r.Context(), h.DB, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := make([]PropertyObjectCard, len(cs))
	for i, c := range cs {
		out[i] = objectView(c)
	}
	writeJSON(w, http.StatusOK, map[string][]PropertyObjectCard{"items": out})
}

func (h *Catalog) startRebuild(w http.ResponseWriter, r *http.Request) {
	st, err := h.Rebuilder.Start(r.Context())
	var incomplete *rebuild.IncompleteError
	switch {
	case errors.Is(err, rebuild.ErrRunning):
		writeError(w, http.StatusConflict, "rebuild_running", err.Error())
	case errors.As(err, &incomplete), errors.Is(err, bounded.ErrNoTopic):
		writeError(w, http.StatusConflict, "rebuild_refused", err.Error())
	case err != nil:
		h.Log.Error("projection rebuild did not start", "error", err.Error())
		writeError(w, http.StatusInternalServerError, "internal", "the rebuild did not start: "+err.Error())
	default:
		writeJSON(w, http.StatusAccepted, st)
	}
}

func (h *Catalog) rebuildStatus(w http.ResponseWriter, r *http.Request) {
	st, err := h.Rebuilder.Status(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (h *Catalog) fail(w http.ResponseWriter, r *http.Request, err error) {
	// The feed's writes begin READ WRITE as lib/pq does: a standby answers 0A000.
	err = dberr.Classify(r.Context(), err, dberr.InRecovery(h.DB.DB))
	switch {
	case errors.Is(err, boost.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", "no such card")
	case errors.Is(err, boost.ErrInvalidCard):
		writeError(w, http.StatusUnprocessableEntity, "validation_failed", err.Error())
	case errors.Is(err, boost.ErrConflict):
		writeError(w, http.StatusConflict, "conflict", "a concurrent update won; try again")
	case dberr.ReadOnly(err):
		h.Log.Warn("catalog api: the database takes no writes", "method", r.Method, "path", r.URL.Path, "error", err.Error())
		writeReadOnly(w)
	case unavailable(err):
		h.Log.Warn("catalog api: database unavailable", "method", r.Method, "path", r.URL.Path, "error", err.Error())
		writeUnavailable(w)
	default:
		h.Log.Error("catalog api failed", "method", r.Method, "path", r.URL.Path, "error", err.Error())
		writeError(w, http.StatusInternalServerError, "internal", "internal error")
	}
}
