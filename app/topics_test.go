package main

import (
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/logtest"
	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestPurchaseTopic_IsCompacted: the purchase topic is a changelog of full
// snapshots keyed by PurchaseId, created with cleanup.policy=compact so that a
// rebuild from the earliest offset sees every purchase's latest state. The
// other topics keep the broker's retention, and an existing purchase topic
// that is not compacted draws a warning.
func TestPurchaseTopic_IsCompacted(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Cluster(t)
	purchases, dlq := "pf-test-"+kafkatest.RandomSuffix(), "pf-test-"+kafkatest.RandomSuffix()
	kafkatest.CleanupTopic(t, purchases)
	kafkatest.CleanupTopic(t, dlq)
	cfg := topicConfig{Partitions: 2, Replication: 1, Create: true}
	logs := &logtest.Logs{}

	require.NoError(t, cfg.ensure(cluster, logs.Logger(), purchases, dlq))

	admin, err := sarama.NewClusterAdmin(cluster.Brokers, cluster.ClientConfig("promoflow-test"))
	require.NoError(t, err)
	defer admin.Close()
	policiesOf := func(topic string) []string {
		var policies []string
		// A topic just created may not be described by the broker at once.
		require.Eventually(t, func() bool {
			var err error
			policies, err = kafkakit.CleanupPolicies(admin, topic)
			return err == nil
		}, 30*time.Second, 50*time.Millisecond)
		return policies
	}
	require.Equal(t, []string{kafkakit.PolicyCompact}, policiesOf(purchases))
	require.Equal(t, []string{kafkakit.PolicyDelete}, policiesOf(dlq))
	require.Empty(t, logs.Find(slog.LevelWarn, "purchase topic is not compacted"))

	legacy := kafkatest.Topic(t, 1)
	require.NoError(t, cfg.ensure(cluster, logs.Logger(), legacy))
	warned := logs.Find(slog.LevelWarn, "purchase topic is not compacted")
	require.Len(t, warned, 1, "an existing purchase topic that is not compacted is named")
	require.Equal(t, legacy, warned[0]["topic"])
}
