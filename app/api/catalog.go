package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strconv"
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
	// FeedToken guards the card feed's writes, and lets card reads see every
	// card. Empty refuses the writes.
	FeedToken string
	// AdminToken guards the rebuild, and lets card reads see every card.
	// Empty refuses the rebuild.
	AdminToken string
	// Rebuilder runs the projection rebuild; the process stops it at exit.
	Rebuilder *rebuild.Rebuilder
	// RateLimit bounds the feed's and the admin token's calls (429 beyond it).
	RateLimit RateLimit
	Log       *slog.Logger

	feed, admin digest
	limit       *limiters
}

// Register mounts the card feed and the card reads, and the API's OpenAPI
// document at GET /openapi.json, on public, and the projection rebuild on
// internal: the feed's caller (the chessboard service) reaches the public
// listener, the rebuild is for operators only.
func (h *Catalog) Register(public, internal *http.ServeMux) {
	serveDocument(public, catalogDocument)
	h.limit = newLimiters(h.RateLimit)
	if h.FeedToken != "" {
		h.feed = digestOf(h.FeedToken)
	}
	if h.AdminToken != "" {
		h.admin = digestOf(h.AdminToken)
	}
	public.HandleFunc("PUT /cards/projects/{id}", h.guard("feed", h.feed, h.putProject))
	public.HandleFunc("PUT /cards/property-objects/{id}", h.guard("feed", h.feed, h.putObject))
	public.HandleFunc("GET /cards/projects/{id}", read(h, boost.GetProjectCard, boost.GetPublicProjectCard, projectView))
	public.HandleFunc("GET /cards/projects/{id}/property-objects", h.listObjects)
	public.HandleFunc("GET /cards/property-objects/{id}", read(h, boost.GetPropertyObjectCard, boost.GetPublicPropertyObjectCard, objectView))
	internal.HandleFunc("POST /admin/projections/rebuild", h.guard("admin", h.admin, h.startRebuild))
	internal.HandleFunc("GET /admin/projections/rebuild", h.guard("admin", h.admin, h.rebuildStatus))
}

// guard answers 401 unless the request carries the token of digest want, and
// 429 beyond the rate limit of who.
func (h *Catalog) guard(who string, want digest, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !want.matches(bearer(r)) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="promoflow-`+who+`"`)
			writeError(w, http.StatusUnauthorized, "unauthorized", "the "+who+" bearer token is required")
			return
		}
		h.limit.metered(who, w, r, next)
	}
}

// seesEverything reports whether the caller holds the feed's or the admin
// token: an anonymous reader sees public cards only.
func (h *Catalog) seesEverything(r *http.Request) bool {
	token := bearer(r)
	return token != "" && (h.feed.matches(token) || h.admin.matches(token))
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

// read answers one card, read by get for the feed's and the operator's
// credentials and by getPublic for anyone else, and shown by view.
func read[C, V any](h *Catalog, get, getPublic func(context.Context, sqlx.QueryerContext, uuid.UUID) (C, error), view func(C) V) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, ok := pathID(w, r)
		if !ok {
			return
		}
		load := get
		if !h.seesEverything(r) {
			load = getPublic
		}
		c, err := load(r.Context(), h.DB, id)
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
	list := boost.ListPropertyObjectCards
	if !h.seesEverything(r) {
		list = boost.ListPublicPropertyObjectCards
	}
	cs, err := list(r.Context(), h.DB, id)
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
	var cooldown *rebuild.CooldownError
	switch {
	case errors.As(err, &cooldown):
		secs := strconv.Itoa(max(1, int(math.Ceil(cooldown.RetryAfter.Seconds()))))
		w.Header().Set("Retry-After", secs)
		writeError(w, http.StatusTooManyRequests, "rebuild_cooldown", err.Error())
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
