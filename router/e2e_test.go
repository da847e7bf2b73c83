package router_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/app/testenv"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/purchase"
)

// TestEndToEnd_PurchaseBoostsCardsAndCancelOrExpiryRemovesIt runs both
// contexts on real PostgreSQL and Kafka: API use case → outbox → relay →
// topic → consumer → cards.
func TestEndToEnd_PurchaseBoostsCardsAndCancelOrExpiryRemovesIt(t *testing.T) {
	c := setupCatalog(t, true)
	p := promotionBundle{db: c.db, topic: c.cfg.Topic}
	project, published, draft := uuid.New(), uuid.New(), uuid.New()
	c.projectCard(t, project)
	c.objectCard(t, published, project, true)
	c.objectCard(t, draft, project, false)
	p.start(t, 200*time.Millisecond)
	c.start(t)

	svc := &purchase.Service{DB: c.db, Topic: c.cfg.Topic}
	ctx := context.Background()
	tenant := uuid.New()
	projectBuy, _, err := svc.Create(ctx, tenant, "", purchase.Draft{PackageKind: "Top", BoostWeight: 30,
		Targets: []event.Target{target(event.TargetProject, project)}, EndsAt: time.Now().Add(time.Hour)}, "e2e")
	require.NoError(t, err)
	c.waitBoost(t, event.TargetProject, project, 30)
	c.waitBoost(t, event.TargetPropertyObject, published, 30)
	require.Zero(t, c.boostOf(event.TargetPropertyObject, draft))

	// A purchase on the object that expires by itself in a few seconds.
	_, _, err = svc.Create(ctx, tenant, "", purchase.Draft{PackageKind: "Top", BoostWeight: 50,
		Targets: []event.Target{target(event.TargetPropertyObject, published)}, EndsAt: time.Now().Add(5 * time.Second)}, "e2e")
	require.NoError(t, err)
	c.waitBoost(t, event.TargetPropertyObject, published, 80)
	c.waitBoost(t, event.TargetPropertyObject, published, 30) // expired by the expirer

	_, err = svc.Cancel(ctx, tenant, projectBuy.ID, "e2e")
	require.NoError(t, err)
	c.waitBoost(t, event.TargetProject, project, 0)
	c.waitBoost(t, event.TargetPropertyObject, published, 0)

	// Kafka delivers the Active record again, and an old snapshot late:
	// neither brings the boost back.
	records := testenv.ReadTopic(t, c.cfg.Topic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 4 })
	for _, rec := range records {
		if ev, err := event.Parse(rec.Value); err == nil && ev.PurchaseId == projectBuy.ID && ev.Status == event.StatusActive {
			msg, err := kafka.DefaultMarshaler{}.Unmarshal(rec)
			require.NoError(t, err)
			require.NoError(t, c.pub.Publish(c.cfg.Topic, msg)) // same MessageId: duplicate
			c.produce(t, ev)                                    // new MessageId, Version 1: stale
		}
	}
	c.waitConsumed(t, 6)
	require.Zero(t, c.boostOf(event.TargetProject, project))
	require.Zero(t, c.boostOf(event.TargetPropertyObject, published))
}
