package boost

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
)

// VisibilityPublic is the Visibility of a project whose cards anyone may read.
// Every other value (a private or unpublished project) is read only with the
// feed's or the operator's credential: such cards carry prices the builder
// has not made public.
const VisibilityPublic = "Public"

// publicProjects are the projects anyone may read.
const publicProjects = `SELECT id FROM catalog.project_cards WHERE visibility = '` + VisibilityPublic + `'`

// GetPublicProjectCard reads one project card anyone may read; ErrNotFound
// when there is none or it is not public, so that a private card's existence
// does not show.
func GetPublicProjectCard(ctx context.Context, q sqlx.QueryerContext, id uuid.UUID) (ProjectCard, error) {
	return getCard[ProjectCard](ctx, q, "project card",
		`SELECT `+projectColumns+` FROM catalog.project_cards WHERE id = $1 AND id IN (`+publicProjects+`)`, id)
}

// GetPublicPropertyObjectCard reads one published property-object card of a
// public project; ErrNotFound otherwise.
func GetPublicPropertyObjectCard(ctx context.Context, q sqlx.QueryerContext, id uuid.UUID) (PropertyObjectCard, error) {
	return getCard[PropertyObjectCard](ctx, q, "property object card",
		`SELECT `+objectColumns+` FROM catalog.property_object_cards WHERE id = $1 AND published AND project_id IN (`+publicProjects+`)`, id)
}

// ListPublicPropertyObjectCards reads the published property-object cards of
// a public project in id order: none for any other project, as for one that
// is absent.
func ListPublicPropertyObjectCards(ctx context.Context, q sqlx.QueryerContext, projectID uuid.UUID) ([]PropertyObjectCard, error) {
	var cs []PropertyObjectCard
	err := sqlx.SelectContext(ctx, q, &cs, `SELECT `+objectColumns+` FROM catalog.property_object_cards
		WHERE project_id = $1 AND published AND project_id IN (`+publicProjects+`) ORDER BY id`, projectID)
	if err != nil {
		return nil, fmt.Errorf("list public property object cards: %w", err)
	}
	return cs, nil
}
