package rebuild_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/router/rebuild"
)

// groupOffsets maps every partition of the bundle's topic to the consumer
// group's committed offset (-1: none).
func groupOffsets(t *testing.T, b *catalogtest.Bundle) map[int32]int64 {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(kafkatest.Brokers(t), kafkatest.Cluster(t).ClientConfig("promoflow-test"))
	require.NoError(t, err)
	defer admin.Close()
	parts := catalogtest.PartitionSizes(t, b.Cfg.Topic)
	ids := make([]int32, 0, len(parts))
	for p := range parts {
		ids = append(ids, p)
	}
	res, err := admin.ListConsumerGroupOffsets(b.Cfg.ConsumerGroup, map[string][]int32{b.Cfg.Topic: ids})
	require.NoError(t, err)
	out := map[int32]int64{}
	for _, p := range ids {
		block := res.GetBlock(b.Cfg.Topic, p)
		require.NotNil(t, block)
		require.Equal(t, sarama.ErrNoError, block.Err)
		out[p] = block.Offset
	}
	return out
}

// waitGroupAtEnds waits until the group committed every partition's end.
func waitGroupAtEnds(t *testing.T, b *catalogtest.Bundle, what string) {
	t.Helper()
	require.Eventually(t, func() bool {
		ends := catalogtest.PartitionSizes(t, b.Cfg.Topic)
		for p, off := range groupOffsets(t, b) {
			if ends[p] > 0 && off != ends[p] {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "%s: the group's offsets %v, the ends %v", what, groupOffsets(t, b),
		catalogtest.PartitionSizes(t, b.Cfg.Topic))
}

// TestRebuild_LiveGroupPositionIsConsistentAfterTheSwitch: the consumer is
// stopped with events on the topic it has not read yet; a rebuild of the
// corrupted projection builds them in and leaves the group's offsets where
// they were. The consumer, started again, goes on from there: it reads the
// events it had not read (no-ops on the new projection) and those sent after
// the switch, not one record more (nothing from before its position is
// applied again; a redelivery of a record it applied before the rebuild is a
// duplicate by the dedup marks the rebuild kept), and its offsets reach the
// topic's ends (nothing is skipped).
func TestRebuild_LiveGroupPositionIsConsistentAfterTheSwitch(t *testing.T) {
	b := setup(t)
	projects, objects := cards(t, b)
	stop := b.Start(t)
	h := &history{}
	produceHistory(t, b, h, projects, objects, 12)
	applied := catalogtest.PurchaseEvent(event.StatusActive, 1, 69, catalogtest.Target(event.TargetProject, projects[1]))
	appliedMsg := h.produce(t, b, applied)
	b.WaitConsumed(t, float64(h.sent()), 30*time.Second)
	waitGroupAtEnds(t, b, "before the rebuild")
	corrupt(t, b, h)
	stop()
	position := groupOffsets(t, b)

	// Sent while the consumer is stopped: read by the rebuild only.
	pending := catalogtest.PurchaseEvent(event.StatusActive, 1, 70, catalogtest.Target(event.TargetProject, projects[0]),
		catalogtest.Target(event.TargetPropertyObject, objects[0]))
	h.produce(t, b, pending)
	windowEvents(t, b, h, projects[1], objects[3], 71)
	lagging := h.sent() - int(b.Consumed())

	st, err := newRebuilder(t, b).Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, rebuild.StateDone, st.State)
	requireModel(t, b, h, "after the switch, the consumer stopped: the events it has not read are in")
	require.Equal(t, position, groupOffsets(t, b), "the rebuild leaves the group's offsets as they were")

	b.Metrics = nil // counts of the restarted consumer alone
	b.Start(t)
	h.redeliver(t, b, appliedMsg, applied)
	updated := pending
	updated.Version, updated.Status = 2, event.StatusExpired
	h.produce(t, b, updated)
	after := 2 // sent after the switch

	waitGroupAtEnds(t, b, "after the switch")
	require.Equal(t, float64(lagging+after), b.Consumed(), "the consumer read the %d records past its position and the %d "+
		"sent after the switch, no more", lagging, after)
	require.Equal(t, 1.0, testutil.ToFloat64(b.Metrics.Consumed.WithLabelValues("duplicate")),
		"the redelivered record is a duplicate")
	requireModel(t, b, h, "after the consumer caught up")
}
