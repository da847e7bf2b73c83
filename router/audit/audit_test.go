package audit_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/audit"
	"github.com/promoflow/promoflow/router/catalogtest"
)

type bundle struct {
	*catalogtest.Bundle
	auditor *audit.Auditor
	project uuid.UUID
	objects []uuid.UUID
}

// setup runs a catalog with a project of three published objects and some
// consumed history.
func setup(t *testing.T) *bundle {
	t.Helper()
	t.Parallel()
	b := &bundle{Bundle: catalogtest.New(t, true), project: uuid.New()}
	b.Cfg.AuditInterval = 200 * time.Millisecond
	b.ProjectCard(t, b.project)
	for range 3 {
		o := uuid.New()
		b.ObjectCard(t, o, b.project, true)
		b.objects = append(b.objects, o)
	}
	b.Start(t)
	for i := range 6 {
		ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 10+i, catalogtest.Target(event.TargetProject, b.project),
			catalogtest.Target(event.TargetPropertyObject, b.objects[i%3]))
		b.Produce(t, ev)
		if i%2 == 0 {
			ev.Status, ev.Version = event.StatusExpired, 2
			b.Produce(t, ev)
		}
	}
	b.WaitConsumed(t, 9, 30*time.Second)
	a, err := audit.New(audit.Config{DB: b.DB, Kafka: b.Cfg.Kafka, Topic: b.Cfg.Topic,
		ConsumerGroup: b.Cfg.ConsumerGroup, Log: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	b.auditor = a
	return b
}

func TestAudit_FindsDriftedCardsAndRepairsThemWhileTheConsumerRuns(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	rep, err := b.auditor.Cards(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 4, rep.Checked)
	require.Zero(t, rep.Drifted)

	// A lost and a doubled delta.
	_, err = b.DB.Exec(`UPDATE catalog.property_object_cards SET promotion_boost = promotion_boost + 11 WHERE id = $1`, b.objects[0])
	require.NoError(t, err)
	_, err = b.DB.Exec(`UPDATE catalog.project_cards SET promotion_boost = 0 WHERE id = $1`, b.project)
	require.NoError(t, err)
	rep, err = b.auditor.Cards(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, rep.Drifted)
	require.Len(t, rep.Samples, 2)
	require.Eventually(t, func() bool { return testutil.ToFloat64(b.Metrics.DriftCards) == 2 }, 10*time.Second, 20*time.Millisecond,
		"the catalog process audits periodically")

	// Live traffic on the same cards while the repair runs.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20 {
			b.Produce(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 1, catalogtest.Target(event.TargetProject, b.project),
				catalogtest.Target(event.TargetPropertyObject, b.objects[i%3])))
		}
	}()
	require.NoError(t, b.auditor.Repair(ctx, &rep))
	require.Equal(t, 2, rep.Repaired)
	<-done
	b.WaitConsumed(t, 29, 30*time.Second)

	rep, err = b.auditor.Cards(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.Drifted, "%v", rep.Samples)
	require.Eventually(t, func() bool { return testutil.ToFloat64(b.Metrics.DriftCards) == 0 }, 10*time.Second, 20*time.Millisecond)
}

func TestAudit_ReplicaAgreesWithTheTopicAndNamesWhatDiffers(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	replica := func() audit.ReplicaReport {
		t.Helper()
		var rep audit.ReplicaReport
		// The consumer commits its offsets every second: until then its
		// records count as pending.
		require.Eventually(t, func() bool {
			var err error
			rep, err = b.auditor.Replica(ctx)
			require.NoError(t, err)
			return rep.Pending == 0
		}, 30*time.Second, 100*time.Millisecond)
		return rep
	}
	rep := replica()
	require.EqualValues(t, 6, rep.Purchases)
	require.Zero(t, rep.Drifted, "%v", rep.Samples)

	var drifted uuid.UUID
	require.NoError(t, b.DB.Get(&drifted, `UPDATE catalog.promotion_contributions SET version = 1, active = true, status = 'Active'
		WHERE purchase_id = (SELECT purchase_id FROM catalog.promotion_contributions WHERE version = 2 LIMIT 1)
		RETURNING purchase_id`))
	b.ProduceRaw(t, uuid.NewString(), []byte(`{"Version":0}`))
	require.Eventually(t, func() bool { return testutil.ToFloat64(b.Metrics.DLQ) == 1 }, 30*time.Second, 10*time.Millisecond)

	rep = replica()
	require.Equal(t, 1, rep.Drifted)
	require.Equal(t, drifted, rep.Samples[0].PurchaseId)
	require.Contains(t, rep.Samples[0].Problem, "the latest event is version 2")
	require.EqualValues(t, 1, rep.Unreadable, "a record that breaks the contract is counted, not compared")
}

// TestAudit_RecordsTheConsumerHasNotReadArePendingNotDrift: for a group that
// has consumed nothing, a purchase whose replica is behind the topic is
// pending; one whose replica is at the topic's newest version is compared:
// equal, or drift.
func TestAudit_RecordsTheConsumerHasNotReadArePendingNotDrift(t *testing.T) {
	b := setup(t)
	a, err := audit.New(audit.Config{DB: b.DB, Kafka: b.Cfg.Kafka, Topic: b.Cfg.Topic,
		ConsumerGroup: "pf-test-never-consumed", Log: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	var behind, changed uuid.UUID
	require.NoError(t, b.DB.Get(&behind, `DELETE FROM catalog.promotion_contributions
		WHERE purchase_id = (SELECT min(purchase_id::text)::uuid FROM catalog.promotion_contributions) RETURNING purchase_id`))
	require.NoError(t, b.DB.Get(&changed, `UPDATE catalog.promotion_contributions SET boost_weight = boost_weight + 1
		WHERE purchase_id = (SELECT max(purchase_id::text)::uuid FROM catalog.promotion_contributions) RETURNING purchase_id`))

	rep, err := a.Replica(context.Background())

	require.NoError(t, err)
	require.EqualValues(t, 6, rep.Purchases)
	require.EqualValues(t, 1, rep.Pending, "the purchase the replica does not hold yet")
	require.Equal(t, 1, rep.Drifted, "the purchase whose replica is at the topic's version: %v", rep.Samples)
	require.Equal(t, changed, rep.Samples[0].PurchaseId)
	require.NotEqual(t, behind, changed)
}
