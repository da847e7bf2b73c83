package kafkakit

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/IBM/sarama"
)

// Cleanup policies of a topic (cleanup.policy).
const (
	// PolicyCompact keeps the newest record of every key for ever: the
	// purchase topic is a changelog of full snapshots keyed by PurchaseId, so
	// a rebuild from the earliest offset sees every purchase's latest state.
	PolicyCompact = "compact"
	// PolicyDelete drops records after the topic's retention (the broker's
	// default is 7 days).
	PolicyDelete = "delete"
)

// Topic is a topic to create when it is missing.
type Topic struct {
	Name       string
	Partitions int32
	// Replication is the replication factor; 0 follows the cluster
	// (ReplicationFor the brokers its metadata names).
	Replication int16
	// CleanupPolicy is PolicyCompact or PolicyDelete; empty keeps the broker's default (delete).
	CleanupPolicy string
}

// ReplicationFor is the replication factor of a topic on a cluster of
// brokers: 1 on one broker, 3 on three or more (2 on two).
func ReplicationFor(brokers int) int16 {
	return int16(min(max(brokers, 1), 3))
}

// MinInsyncReplicasFor is the min.insync.replicas a topic of replication
// factor rf gets, "" for the broker's default: 2 where there are 3 replicas
// or more, so that an acknowledged write (acks=all) is on two brokers and
// one broker may be away without refusing writes.
func MinInsyncReplicasFor(rf int16) string {
	if rf >= 3 {
		return "2"
	}
	return ""
}

// EnsureTopics creates the topics that do not exist yet and returns those it
// created, with the replication factor each got. An existing topic is left
// as it is: its settings are the operator's.
func EnsureTopics(cluster Cluster, topics ...Topic) ([]Topic, error) {
	admin, err := sarama.NewClusterAdmin(cluster.Brokers, cluster.ClientConfig("promoflow-admin"))
	if err != nil {
		return nil, fmt.Errorf("connect kafka admin: %w", err)
	}
	defer admin.Close()
	var created []Topic
	clusterRF := int16(0) // read once, when a topic follows the cluster
	for _, t := range topics {
		if t.Replication == 0 && clusterRF == 0 {
			brokers, _, err := admin.DescribeCluster()
			if err != nil {
				return created, fmt.Errorf("count the brokers for the replication of %s: %w", t.Name, err)
			}
			clusterRF = ReplicationFor(len(brokers))
		}
		t.Replication = cmp.Or(t.Replication, clusterRF)
		detail := &sarama.TopicDetail{NumPartitions: t.Partitions, ReplicationFactor: t.Replication, ConfigEntries: map[string]*string{}}
		if t.CleanupPolicy != "" {
			detail.ConfigEntries["cleanup.policy"] = &t.CleanupPolicy
		}
		if isr := MinInsyncReplicasFor(t.Replication); isr != "" {
			detail.ConfigEntries["min.insync.replicas"] = &isr
		}
		err := admin.CreateTopic(t.Name, detail, false)
		var te *sarama.TopicError
		if errors.As(err, &te) && te.Err == sarama.ErrTopicAlreadyExists {
			continue
		}
		if err != nil {
			return created, fmt.Errorf("create topic %s: %w", t.Name, err)
		}
		created = append(created, t)
	}
	return created, nil
}

// CleanupPolicies reads the cleanup.policy of a topic, e.g. ["compact"] or
// ["compact", "delete"].
func CleanupPolicies(admin sarama.ClusterAdmin, topic string) ([]string, error) {
	configs, err := TopicConfigs(admin, topic, "cleanup.policy")
	if err != nil {
		return nil, err
	}
	value, ok := configs["cleanup.policy"]
	if !ok {
		return []string{PolicyDelete}, nil
	}
	var out []string
	for _, p := range strings.Split(value, ",") {
		out = append(out, strings.TrimSpace(p))
	}
	return out, nil
}

// TopicConfigs reads the named configs of a topic (its own or the broker's
// default), by name.
func TopicConfigs(admin sarama.ClusterAdmin, topic string, names ...string) (map[string]string, error) {
	res, err := admin.DescribeConfigs([]*sarama.ConfigResource{{
		Type: sarama.TopicResource, Name: topic, ConfigNames: names,
	}}, sarama.DescribeConfigsOptions{})
	if err == nil && len(res) != 1 {
		err = fmt.Errorf("%d results for one topic", len(res))
	}
	if err == nil && res[0].ErrorCode != sarama.ErrNoError {
		err = res[0].ErrorCode
	}
	if err != nil {
		return nil, fmt.Errorf("describe topic %s: %w", topic, err)
	}
	out := make(map[string]string, len(res[0].Configs))
	for _, e := range res[0].Configs {
		out[e.Name] = e.Value
	}
	return out, nil
}

// OnlyCompacted reports whether records of a topic with these policies leave
// only when a newer record of the same key replaces them: "compact" without
// "delete" (which would also drop them after the retention).
func OnlyCompacted(policies []string) bool {
	return slices.Contains(policies, PolicyCompact) && !slices.Contains(policies, PolicyDelete)
}
