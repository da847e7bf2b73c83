package router_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/audit"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/rebuild"
)

// TestAuditReplica_AfterARebuildNothingIsPending: a rebuild builds the replica
// from a topic that the consumer group never read; the replica check then
// finds every purchase at the topic's newest version: none pending, none
// drifted, whatever the group's offsets say. A purchase changed on the topic
// after the rebuild is pending (the replica is behind and the group has not
// read it); a replica row changed at the topic's version is drift.
func TestAuditReplica_AfterARebuildNothingIsPending(t *testing.T) {
	t.Parallel()
	b := catalogtest.New(t, true)
	project := uuid.New()
	b.ProjectCard(t, project)
	var purchases []event.PurchaseChanged
	for i := range 20 {
		ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 1+i, catalogtest.Target(event.TargetProject, project))
		b.Produce(t, ev)
		if i%3 == 0 {
			ev.Status, ev.Version = event.StatusExpired, 2
			b.Produce(t, ev)
		}
		purchases = append(purchases, ev)
	}
	rb, err := rebuild.New(rebuild.Config{DB: b.DB, Kafka: b.Cfg.Kafka, Topic: b.Cfg.Topic, Log: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	st, err := rb.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, rebuild.StateDone, st.State)
	a, err := audit.New(audit.Config{DB: b.DB, Kafka: b.Cfg.Kafka, Topic: b.Cfg.Topic, ConsumerGroup: b.Cfg.ConsumerGroup,
		Log: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)

	rep, err := a.Replica(context.Background())
	require.NoError(t, err)
	require.Equal(t, audit.ReplicaReport{Purchases: 20}, rep, "after the rebuild, the group having read nothing")

	later := purchases[1]
	later.Status, later.Version = event.StatusCancelled, 2
	b.Produce(t, later)
	_, err = b.DB.Exec(`UPDATE catalog.promotion_contributions SET boost_weight = 99 WHERE purchase_id = $1`, purchases[2].PurchaseId)
	require.NoError(t, err)
	rep, err = a.Replica(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 20, rep.Purchases)
	require.EqualValues(t, 1, rep.Pending, "the purchase changed on the topic after the rebuild")
	require.Equal(t, 1, rep.Drifted, "%v", rep.Samples)
	require.Equal(t, purchases[2].PurchaseId, rep.Samples[0].PurchaseId)
	require.Contains(t, rep.Samples[0].Problem, "weight=99")
}
