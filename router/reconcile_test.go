package router_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/purchase"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/router/reconcile"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestReconcile_RepairsPhantomsAfterFailover: the relay on the primary
// publishes a purchase and a cancel that its standby, cut off, never
// receives; the primary dies and the standby is promoted. The catalog then
// boosts a purchase that does not exist and has ended the boost of one
// that is Active. Reconcile finds both, writes the database's truth through
// the outbox, and once the relay on the new primary has published it, every
// card's boost is what the database's purchases make it. A second run finds
// nothing.
func TestReconcile_RepairsPhantomsAfterFailover(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartServer(t, pgtest.ServerOptions{})
	standby := srv.StartStandby(t, "replica1")
	primaryURL := pgtest.DatabaseURLOn(t, srv.URL("sslmode=disable"))
	primary := pgtest.Open(t, primaryURL)
	c := catalogtest.New(t, true)
	c.Start(t)
	stopRelay := catalogtest.RunPromotion(t, primary, c.Cfg.Topic, router.PromotionConfig{})
	svc := purchasetest.NewService(t, primary, c.Cfg.Topic)
	cards := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	for _, id := range cards {
		c.ProjectCard(t, id)
	}
	tenant := uuid.New()
	create := func(card uuid.UUID, weight int) purchase.Purchase {
		p, _, err := svc.Create(t.Context(), tenant, "", purchase.Draft{PackageKind: "Top", BoostWeight: weight,
			Targets: []event.Target{catalogtest.Target(event.TargetProject, card)}, EndsAt: time.Now().Add(time.Hour)}, "reconcile-test")
		require.NoError(t, err)
		return p
	}

	active := create(cards[0], 7) // cancelled later, on the primary alone
	create(cards[1], 11)
	c.WaitBoost(t, event.TargetProject, cards[0], 7)
	c.WaitBoost(t, event.TargetProject, cards[1], 11)
	srv.WaitReplayed(t, standby)

	standby.Detach(t)
	phantom := create(cards[2], 13)
	_, err := svc.Cancel(t.Context(), tenant, active.ID, "reconcile-test")
	require.NoError(t, err)
	c.WaitBoost(t, event.TargetProject, cards[2], 13)
	c.WaitBoost(t, event.TargetProject, cards[0], 0)
	stopRelay()
	srv.Kill(t)
	standby.Promote(t)

	u, err := url.Parse(primaryURL)
	require.NoError(t, err)
	promoted := standby.OpenDatabase(t, strings.TrimPrefix(u.Path, "/"))
	catalogtest.RunPromotion(t, promoted, c.Cfg.Topic, router.PromotionConfig{})
	cfg := reconcile.Config{DB: promoted, Kafka: kafkatest.Cluster(t), Topic: c.Cfg.Topic, Log: slog.New(slog.DiscardHandler)}
	rep, err := reconcile.Run(t.Context(), cfg)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{phantom.ID}, rep.Missing, "the purchase created after the standby was cut off")
	require.Equal(t, []uuid.UUID{active.ID}, rep.Behind, "the purchase cancelled after the standby was cut off")

	require.Eventually(t, func() bool { return fmt.Sprint(c.CardBoosts(t)) == fmt.Sprint(recompute(t, promoted, cards)) },
		time.Minute, 50*time.Millisecond, "every card's boost is what the database's purchases make it: have %v, want %v",
		c.CardBoosts(t), recompute(t, promoted, cards))
	require.Equal(t, 2, rep.Repaired)
	states := purchasetest.Statuses(t, promoted)
	require.Equal(t, purchasetest.State{Status: event.StatusCancelled, Version: 2}, states[phantom.ID],
		"the missing purchase is a Cancelled row at the topic's version + 1")
	require.Equal(t, purchasetest.State{Status: event.StatusActive, Version: 3}, states[active.ID],
		"the purchase behind the topic keeps its state at the topic's version + 1")

	again, err := reconcile.Run(t.Context(), cfg)
	require.NoError(t, err)
	require.Zero(t, again.Found(), "a second run finds nothing: %+v", again)
}

// recompute is each card's boost from the database's purchases: the sum of
// the weights of the Active ones that target it.
func recompute(t *testing.T, db *sqlx.DB, cards []uuid.UUID) map[uuid.UUID]int {
	t.Helper()
	out := make(map[uuid.UUID]int, len(cards))
	for _, id := range cards {
		out[id] = 0
	}
	var rows []purchase.Row
	require.NoError(t, db.SelectContext(context.Background(), &rows, `SELECT `+purchase.Columns+` FROM promotion.promotion_purchases`))
	for _, r := range rows {
		p, err := r.Decode()
		require.NoError(t, err)
		if p.Status != event.StatusActive {
			continue
		}
		for _, target := range p.Targets {
			if _, ok := out[target.TargetId]; ok && target.TargetKind == event.TargetProject {
				out[target.TargetId] += p.BoostWeight
			}
		}
	}
	return out
}
