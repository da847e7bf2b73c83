package kafkakit_test

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestReplicationFor_OneOnOneBrokerThreeFromThreeOn: a topic has as many
// replicas as the cluster has brokers, up to three, and two of three must
// take a write.
func TestReplicationFor_OneOnOneBrokerThreeFromThreeOn(t *testing.T) {
	t.Parallel()
	for brokers, want := range map[int]int16{0: 1, 1: 1, 2: 2, 3: 3, 5: 3} {
		require.Equal(t, want, kafkakit.ReplicationFor(brokers), "%d brokers", brokers)
	}
	require.Equal(t, "", kafkakit.MinInsyncReplicasFor(1), "one replica: the broker's default")
	require.Equal(t, "", kafkakit.MinInsyncReplicasFor(2))
	require.Equal(t, "2", kafkakit.MinInsyncReplicasFor(3))
}

// TestEnsureTopics_ReplicationFollowsTheClusterItFinds: a topic created
// without a replication factor gets the one its cluster's broker count
// calls for (1 on the test stack's one broker, 3 and min.insync.replicas=2
// on PROMOFLOW_KAFKA_NODES=3), and says so; an explicit one is kept.
func TestEnsureTopics_ReplicationFollowsTheClusterItFinds(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Cluster(t)
	admin, err := sarama.NewClusterAdmin(cluster.Brokers, cluster.ClientConfig("promoflow-test"))
	require.NoError(t, err)
	defer admin.Close()
	brokers, _, err := admin.DescribeCluster()
	require.NoError(t, err)
	// The rule, written out: 1 replica on one broker, 3 from three brokers on.
	want := int16(min(len(brokers), 3))

	follows, explicit := "pf-test-"+kafkatest.RandomSuffix(), "pf-test-"+kafkatest.RandomSuffix()
	kafkatest.CleanupTopic(t, follows)
	kafkatest.CleanupTopic(t, explicit)
	created, err := kafkakit.EnsureTopics(cluster, kafkakit.Topic{Name: follows, Partitions: 2},
		kafkakit.Topic{Name: explicit, Partitions: 1, Replication: 1})
	require.NoError(t, err)
	require.Equal(t, []kafkakit.Topic{{Name: follows, Partitions: 2, Replication: want},
		{Name: explicit, Partitions: 1, Replication: 1}}, created)

	// A topic just created may not be in every broker's metadata at once.
	var described []*sarama.TopicMetadata
	require.Eventually(t, func() bool {
		described, err = admin.DescribeTopics([]string{follows, explicit})
		return err == nil && described[0].Err == sarama.ErrNoError && described[1].Err == sarama.ErrNoError
	}, 30*time.Second, 50*time.Millisecond, "%v", err)
	for _, d := range described {
		for _, p := range d.Partitions {
			wantRF := map[string]int{follows: int(want), explicit: 1}[d.Name]
			require.Len(t, p.Replicas, wantRF, "%s/%d", d.Name, p.ID)
		}
	}
	configs, err := kafkakit.TopicConfigs(admin, follows, "min.insync.replicas")
	require.NoError(t, err)
	if want == 3 {
		require.Equal(t, "2", configs["min.insync.replicas"], "two of three replicas take a write")
	}

	again, err := kafkakit.EnsureTopics(cluster, kafkakit.Topic{Name: follows, Partitions: 2})
	require.NoError(t, err)
	require.Empty(t, again, "an existing topic is left as it is")
}
