package main

import (
	"log/slog"
	"testing"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/app/testenv"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// TestPurchaseTopic_IsCompacted: the purchase topic is a changelog of full
// snapshots keyed by PurchaseId, created with cleanup.policy=compact so that a
// rebuild from the earliest offset sees every purchase's latest state. The
// other topics keep the broker's retention, and an existing purchase topic
// that is not compacted draws a warning.
func TestPurchaseTopic_IsCompacted(t *testing.T) {
	t.Parallel()
	brokers := testenv.Brokers(t)
	purchases, dlq := "pf-test-"+testenv.RandomSuffix(), "pf-test-"+testenv.RandomSuffix()
	testenv.CleanupTopic(t, purchases)
	testenv.CleanupTopic(t, dlq)
	cfg := topicConfig{Partitions: 2, Replication: 1, Create: true}
	logs := &testenv.Logs{}

	require.NoError(t, cfg.ensure(brokers, logs.Logger(), purchases, dlq))

	admin, err := sarama.NewClusterAdmin(brokers, kafkakit.ClientConfig("promoflow-test"))
	require.NoError(t, err)
	defer admin.Close()
	policies, err := kafkakit.CleanupPolicies(admin, purchases)
	require.NoError(t, err)
	require.Equal(t, []string{kafkakit.PolicyCompact}, policies)
	policies, err = kafkakit.CleanupPolicies(admin, dlq)
	require.NoError(t, err)
	require.Equal(t, []string{kafkakit.PolicyDelete}, policies)
	require.Empty(t, logs.Find(slog.LevelWarn, "purchase topic is not compacted"))

	legacy := testenv.Topic(t, 1)
	require.NoError(t, cfg.ensure(brokers, logs.Logger(), legacy))
	warned := logs.Find(slog.LevelWarn, "purchase topic is not compacted")
	require.Len(t, warned, 1, "an existing purchase topic that is not compacted is named")
	require.Equal(t, legacy, warned[0]["topic"])
}
