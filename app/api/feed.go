package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/boost"
)

// The card feed: what the chessboard context PUTs, as the documents'
// ProjectCardFeed and PropertyObjectCardFeed describe it.

// projectFeed is the body of PUT /cards/projects/{id} (schema ProjectCardFeed).
type projectFeed struct {
	Title                    text     `json:"Title"`
	Status                   text     `json:"Status"`
	Visibility               text     `json:"Visibility"`
	MinPrice                 *decimal `json:"MinPrice"`
	PropertyObjectsAvailable *integer `json:"PropertyObjectsAvailable"`
	Payback                  *decimal `json:"Payback"`
	// Id, PromotionBoost and UpdatedAt are ignored: a card read can be sent
	// back as it is.
	Id             json.RawMessage `json:"Id"`
	PromotionBoost json.RawMessage `json:"PromotionBoost"`
	UpdatedAt      json.RawMessage `json:"UpdatedAt"`
}

// objectFeed is the body of PUT /cards/property-objects/{id} (schema
// PropertyObjectCardFeed).
type objectFeed struct {
	ProjectId      canonicalUUID   `json:"ProjectId"`
	Published      bool            `json:"Published"`
	Status         text            `json:"Status"`
	Price          *decimal        `json:"Price"`
	Id             json.RawMessage `json:"Id"`
	PromotionBoost json.RawMessage `json:"PromotionBoost"`
	UpdatedAt      json.RawMessage `json:"UpdatedAt"`
}

// The bounds of catalog.project_cards.property_objects_available, an integer.
const (
	minInt4 = -1 << 31
	maxInt4 = 1<<31 - 1
)

func (h *Catalog) putProject(w http.ResponseWriter, r *http.Request) {
	var in projectFeed
	id, ok := idAndBody(w, r, &in)
	if !ok {
		return
	}
	available := in.PropertyObjectsAvailable.value()
	if available < minInt4 || available > maxInt4 {
		writeError(w, http.StatusUnprocessableEntity, "validation_failed", "the card is not valid", FieldError{
			Field: "PropertyObjectsAvailable", Problem: fmt.Sprintf("must be within %d..%d", minInt4, maxInt4)})
		return
	}
	card := boost.ProjectCard{ID: id, Title: string(in.Title), Status: string(in.Status), Visibility: string(in.Visibility),
		MinPrice: in.MinPrice.str(), PropertyObjectsAvailable: int(available), Payback: in.Payback.str()}
	store(h, w, r, func(ctx context.Context, tx *sqlx.Tx) error { return boost.UpsertProjectCardTx(ctx, tx, card) },
		id, boost.GetProjectCard, projectView)
}

func (h *Catalog) putObject(w http.ResponseWriter, r *http.Request) {
	var in objectFeed
	id, ok := idAndBody(w, r, &in)
	if !ok {
		return
	}
	card := boost.PropertyObjectCard{ID: id, ProjectID: uuid.UUID(in.ProjectId), Published: in.Published, Status: string(in.Status),
		Price: in.Price.str()}
	store(h, w, r, func(ctx context.Context, tx *sqlx.Tx) error { return boost.UpsertPropertyObjectCardTx(ctx, tx, card) },
		id, boost.GetPropertyObjectCard, objectView)
}

// idAndBody reads the path's id and the body into into, or answers the problem.
func idAndBody(w http.ResponseWriter, r *http.Request, into any) (uuid.UUID, bool) {
	id, ok := pathID(w, r)
	return id, ok && decodeBody(w, r, into)
}

// store runs upsert in one transaction and answers the card id as read back
// in it by get, shown by view.
func store[C, V any](h *Catalog, w http.ResponseWriter, r *http.Request, upsert func(context.Context, *sqlx.Tx) error,
	id uuid.UUID, get func(context.Context, sqlx.QueryerContext, uuid.UUID) (C, error), view func(C) V) {
	h.write(w, r, func(ctx context.Context, tx *sqlx.Tx) (any, error) {
		if err := upsert(ctx, tx); err != nil {
			return nil, err
		}
		c, err := get(ctx, tx, id)
		return view(c), err
	})
}
