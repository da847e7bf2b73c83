package boost_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
)

func TestUpsertCard_BoostComesFromReplicaNotInput(t *testing.T) {
	b := setup(t)
	project, object := uuid.New(), uuid.New()
	b.apply(t, changed(uuid.New(), event.StatusActive, 25, 1, onProject(project), onObject(object)))

	card := projectCard(project)
	card.PromotionBoost = 999
	b.upsertProject(t, card)
	obj := objectCard(object, project, true)
	obj.PromotionBoost = 999
	b.upsertObject(t, obj)

	got, err := boost.GetProjectCard(context.Background(), b.db, project)
	require.NoError(t, err)
	card.PromotionBoost, card.UpdatedAt = 25, got.UpdatedAt
	require.Equal(t, card, got)
	require.Equal(t, 50, b.objectBoost(t, object))

	// A later feed update keeps the boost it computes, whatever it is given.
	card.Title, card.PromotionBoost = "Renamed", 0
	b.upsertProject(t, card)
	require.Equal(t, 25, b.projectBoost(t, project))
}

func TestUpsertPropertyObjectCard_PublishingOrMovingRecomputesItsBoost(t *testing.T) {
	b := setup(t)
	first, second := b.newProject(t), b.newProject(t)
	b.apply(t, changed(uuid.New(), event.StatusActive, 10, 1, onProject(first)))
	b.apply(t, changed(uuid.New(), event.StatusActive, 30, 1, onProject(second)))
	object := b.newObject(t, first, false)
	b.apply(t, changed(uuid.New(), event.StatusActive, 5, 1, onObject(object)))
	require.Equal(t, 5, b.objectBoost(t, object), "unpublished: its own contributions only")

	b.upsertObject(t, objectCard(object, first, true))
	require.Equal(t, 15, b.objectBoost(t, object), "published: the project's boost joins")

	b.upsertObject(t, objectCard(object, second, true))
	require.Equal(t, 35, b.objectBoost(t, object), "moved: the new project's boost")

	b.upsertObject(t, objectCard(object, second, false))
	require.Equal(t, 5, b.objectBoost(t, object), "unpublished again")
}

func TestUpsertCard_RejectsEmptyIds(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	err := inTx(ctx, b.db, func(tx *sqlx.Tx) error {
		return boost.UpsertProjectCardTx(ctx, tx, boost.ProjectCard{Status: "Selling", Visibility: "Public"})
	})
	require.ErrorIs(t, err, boost.ErrInvalidCard)
	err = inTx(ctx, b.db, func(tx *sqlx.Tx) error {
		return boost.UpsertPropertyObjectCardTx(ctx, tx, boost.PropertyObjectCard{ID: uuid.New(), Status: "Free"})
	})
	require.ErrorIs(t, err, boost.ErrInvalidCard)
}

func TestGetCard_MissingCardIsErrNotFound(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	_, err := boost.GetProjectCard(ctx, b.db, uuid.New())
	require.ErrorIs(t, err, boost.ErrNotFound)
	_, err = boost.GetPropertyObjectCard(ctx, b.db, uuid.New())
	require.ErrorIs(t, err, boost.ErrNotFound)
}

func TestListPropertyObjectCards_ListsOneProjectsObjects(t *testing.T) {
	b := setup(t)
	project, other := b.newProject(t), b.newProject(t)
	want := map[uuid.UUID]bool{b.newObject(t, project, true): true, b.newObject(t, project, false): true}
	b.newObject(t, other, true)

	got, err := boost.ListPropertyObjectCards(context.Background(), b.db, project)
	require.NoError(t, err)
	require.Len(t, got, 2)
	for i, c := range got {
		require.True(t, want[c.ID])
		require.Equal(t, project, c.ProjectID)
		require.Equal(t, "5100000.00", *c.Price)
		if i > 0 {
			require.Less(t, got[i-1].ID.String(), c.ID.String(), "id order")
		}
	}
}
