package router_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/purchase"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestEndToEnd_PurchaseBoostsCardsAndCancelOrExpiryRemovesIt runs both
// contexts on real PostgreSQL and Kafka: API use case → outbox → relay →
// topic → consumer → cards.
func TestEndToEnd_PurchaseBoostsCardsAndCancelOrExpiryRemovesIt(t *testing.T) {
	c := setupCatalog(t, true)
	p := promotionBundle{db: c.DB, topic: c.Cfg.Topic}
	project, published, draft := uuid.New(), uuid.New(), uuid.New()
	c.ProjectCard(t, project)
	c.ObjectCard(t, published, project, true)
	c.ObjectCard(t, draft, project, false)
	p.start(t, 200*time.Millisecond)
	c.Start(t)

	svc := purchasetest.NewService(t, c.DB, c.Cfg.Topic)
	ctx := context.Background()
	tenant := uuid.New()
	projectBuy, _, err := svc.Create(ctx, tenant, "", purchase.Draft{PackageKind: "Top", BoostWeight: 30,
		Targets: []event.Target{catalogtest.Target(event.TargetProject, project)}, EndsAt: time.Now().Add(time.Hour)}, "e2e")
	require.NoError(t, err)
	c.WaitBoost(t, event.TargetProject, project, 30)
	c.WaitBoost(t, event.TargetPropertyObject, published, 30)
	require.Zero(t, c.BoostOf(event.TargetPropertyObject, draft))

	// A purchase on the object that expires by itself in a few seconds.
	_, _, err = svc.Create(ctx, tenant, "", purchase.Draft{PackageKind: "Top", BoostWeight: 50,
		Targets: []event.Target{catalogtest.Target(event.TargetPropertyObject, published)}, EndsAt: time.Now().Add(5 * time.Second)}, "e2e")
	require.NoError(t, err)
	c.WaitBoost(t, event.TargetPropertyObject, published, 80)
	c.WaitBoost(t, event.TargetPropertyObject, published, 30) // expired by the expirer

	_, err = svc.Cancel(ctx, tenant, projectBuy.ID, "e2e")
	require.NoError(t, err)
	c.WaitBoost(t, event.TargetProject, project, 0)
	c.WaitBoost(t, event.TargetPropertyObject, published, 0)

	// Kafka delivers the Active record again, and an old snapshot late:
	// neither brings the boost back.
	records := kafkatest.ReadTopic(t, c.Cfg.Topic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 4 })
	for _, rec := range records {
		if ev, err := event.Parse(rec.Value); err == nil && ev.PurchaseId == projectBuy.ID && ev.Status == event.StatusActive {
			msg, err := kafka.DefaultMarshaler{}.Unmarshal(rec)
			require.NoError(t, err)
			require.NoError(t, c.Pub.Publish(c.Cfg.Topic, msg)) // same MessageId: duplicate
			c.Produce(t, ev)                                    // new MessageId, Version 1: stale
		}
	}
	c.WaitConsumed(t, 6, 30*time.Second)
	require.Zero(t, c.BoostOf(event.TargetProject, project))
	require.Zero(t, c.BoostOf(event.TargetPropertyObject, published))
}
