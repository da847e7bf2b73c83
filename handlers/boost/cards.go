package boost

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
)

// ErrNotFound is returned by the getters for a card that does not exist.
var ErrNotFound = errors.New("card not found")

// ErrInvalidCard is a card that the feed cannot store (a missing id).
var ErrInvalidCard = errors.New("invalid card")

// ProjectCard is a project's storefront card. Every field but PromotionBoost
// comes from chessboard; the boost consumer never writes them (INV-1).
type ProjectCard struct {
	ID         uuid.UUID `db:"id"`
	Title      string    `db:"title"`
	Status     string    `db:"status"`
	Visibility string    `db:"visibility"`
	// MinPrice is a decimal in text form, nil when unknown.
	MinPrice                 *string `db:"min_price"`
	PropertyObjectsAvailable int     `db:"property_objects_available"`
	// Payback is a decimal in text form, nil when unknown.
	Payback *string `db:"payback"`
	// PromotionBoost is computed from the contribution replica; the upsert
	// ignores the value given.
	PromotionBoost int `db:"promotion_boost"`
	// UpdatedAt is set by the database on every write; the upsert ignores it.
	UpdatedAt time.Time `db:"updated_at"`
}

// PropertyObjectCard is a property object's storefront card. Every field but
// PromotionBoost comes from chessboard; the boost consumer never writes them.
type PropertyObjectCard struct {
	ID        uuid.UUID `db:"id"`
	ProjectID uuid.UUID `db:"project_id"`
	Published bool      `db:"published"`
	Status    string    `db:"status"`
	// Price is a decimal in text form, nil when unknown.
	Price *string `db:"price"`
	// PromotionBoost is computed from the contribution replica; the upsert
	// ignores the value given.
	PromotionBoost int `db:"promotion_boost"`
	// UpdatedAt is set by the database on every write; the upsert ignores it.
	UpdatedAt time.Time `db:"updated_at"`
}

const (
	projectColumns = `id, title, status, visibility, min_price, property_objects_available, payback, promotion_boost, updated_at`
	objectColumns  = `id, project_id, published, status, price, promotion_boost, updated_at`
)

// UpsertProjectCardTx inserts or replaces a project card from the chessboard
// feed, in tx. Its boost is computed from the replica at once, so a card that
// arrives after its contributions gets them (seed: a card not there yet).
func UpsertProjectCardTx(ctx context.Context, tx *sqlx.Tx, c ProjectCard) error {
	if c.ID == uuid.Nil {
		return fmt.Errorf("project card: id must not be empty: %w", ErrInvalidCard)
	}
	// Exclusive: no event of this project overlaps the sum (lock.go).
	if err := lock(ctx, plain(tx), locks{Projects: []string{c.ID.String()}}); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO catalog.project_cards (`+projectColumns+`)
		VALUES ($1::uuid, $2, $3, $4, $5::numeric, $6, $7::numeric, `+projectBoost(replicaSums, "$1::uuid")+`, now())
		ON CONFLICT (id) DO UPDATE SET
			title = excluded.title, status = excluded.status, visibility = excluded.visibility,
			min_price = excluded.min_price, property_objects_available = excluded.property_objects_available,
			payback = excluded.payback, promotion_boost = excluded.promotion_boost, updated_at = excluded.updated_at`,
		c.ID, c.Title, c.Status, c.Visibility, c.MinPrice, c.PropertyObjectsAvailable, c.Payback)
	if err != nil {
		return wrap("upsert project card", err)
	}
	return nil
}

// UpsertPropertyObjectCardTx inserts or replaces a property-object card from
// the chessboard feed, in tx, with its boost computed from the replica at
// once. Publishing a card or moving it to another project takes effect on its
// boost in the same write.
func UpsertPropertyObjectCardTx(ctx context.Context, tx *sqlx.Tx, c PropertyObjectCard) error {
	if c.ID == uuid.Nil || c.ProjectID == uuid.Nil {
		return fmt.Errorf("property object card: id and project id must not be empty: %w", ErrInvalidCard)
	}
	// Exclusive, the new project and then the card: a concurrent event of
	// either neither misses this card in its cascade nor has its
	// contribution missed by the sums below (lock.go).
	if err := lock(ctx, plain(tx), locks{Projects: []string{c.ProjectID.String()}, Objects: []string{c.ID.String()}}); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO catalog.property_object_cards (`+objectColumns+`)
		VALUES ($1::uuid, $2::uuid, $3::boolean, $4, $5::numeric,
			`+objectBoost(replicaSums, "$1::uuid", "$2::uuid", "$3::boolean")+`, now())
		ON CONFLICT (id) DO UPDATE SET
			project_id = excluded.project_id, published = excluded.published, status = excluded.status,
			price = excluded.price, promotion_boost = excluded.promotion_boost, updated_at = excluded.updated_at`,
		c.ID, c.ProjectID, c.Published, c.Status, c.Price)
	if err != nil {
		return wrap("upsert property object card", err)
	}
	return nil
}

// GetProjectCard reads one project card; ErrNotFound when there is none.
func GetProjectCard(ctx context.Context, q sqlx.QueryerContext, id uuid.UUID) (ProjectCard, error) {
	return getCard[ProjectCard](ctx, q, "project card", `SELECT `+projectColumns+` FROM catalog.project_cards WHERE id = $1`, id)
}

// GetPropertyObjectCard reads one property-object card; ErrNotFound when
// there is none.
func GetPropertyObjectCard(ctx context.Context, q sqlx.QueryerContext, id uuid.UUID) (PropertyObjectCard, error) {
	return getCard[PropertyObjectCard](ctx, q, "property object card",
		`SELECT `+objectColumns+` FROM catalog.property_object_cards WHERE id = $1`, id)
}

func getCard[C any](ctx context.Context, q sqlx.QueryerContext, what, query string, id uuid.UUID) (C, error) {
	var c C
	err := sqlx.GetContext(ctx, q, &c, query, id)
	if errors.Is(err, sql.ErrNoRows) {
		return c, fmt.Errorf("%s %s: %w", what, id, ErrNotFound)
	}
	if err != nil {
		return c, fmt.Errorf("get %s: %w", what, err)
	}
	return c, nil
}

// ListPropertyObjectCards reads every property-object card of a project,
// published or not, in id order.
func ListPropertyObjectCards(ctx context.Context, q sqlx.QueryerContext, projectID uuid.UUID) ([]PropertyObjectCard, error) {
	var cs []PropertyObjectCard
	err := sqlx.SelectContext(ctx, q, &cs,
		`SELECT `+objectColumns+` FROM catalog.property_object_cards WHERE project_id = $1 ORDER BY id`, projectID)
	if err != nil {
		return nil, fmt.Errorf("list property object cards: %w", err)
	}
	return cs, nil
}
