package kafkakit

import (
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
	Name        string
	Partitions  int32
	Replication int16
	// CleanupPolicy is PolicyCompact or PolicyDelete; empty keeps the broker's default (delete).
	CleanupPolicy string
}

// EnsureTopics creates the topics that do not exist yet. An existing topic is
// left as it is: its settings are the operator's.
func EnsureTopics(cluster Cluster, topics ...Topic) error {
	admin, err := sarama.NewClusterAdmin(cluster.Brokers, cluster.ClientConfig("promoflow-admin"))
	if err != nil {
		return fmt.Errorf("connect kafka admin: %w", err)
	}
	defer admin.Close()
	for _, t := range topics {
		detail := &sarama.TopicDetail{NumPartitions: t.Partitions, ReplicationFactor: t.Replication}
		if t.CleanupPolicy != "" {
			detail.ConfigEntries = map[string]*string{"cleanup.policy": &t.CleanupPolicy}
		}
		err := admin.CreateTopic(t.Name, detail, false)
		var te *sarama.TopicError
		if errors.As(err, &te) && te.Err == sarama.ErrTopicAlreadyExists {
			continue
		}
		if err != nil {
			return fmt.Errorf("create topic %s: %w", t.Name, err)
		}
	}
	return nil
}

// CleanupPolicies reads the cleanup.policy of a topic, e.g. ["compact"] or
// ["compact", "delete"].
func CleanupPolicies(admin sarama.ClusterAdmin, topic string) ([]string, error) {
	res, err := admin.DescribeConfigs([]*sarama.ConfigResource{{
		Type: sarama.TopicResource, Name: topic, ConfigNames: []string{"cleanup.policy"},
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
	for _, e := range res[0].Configs {
		if e.Name == "cleanup.policy" {
			var out []string
			for _, p := range strings.Split(e.Value, ",") {
				out = append(out, strings.TrimSpace(p))
			}
			return out, nil
		}
	}
	return []string{PolicyDelete}, nil
}

// OnlyCompacted reports whether records of a topic with these policies leave
// only when a newer record of the same key replaces them: "compact" without
// "delete" (which would also drop them after the retention).
func OnlyCompacted(policies []string) bool {
	return slices.Contains(policies, PolicyCompact) && !slices.Contains(policies, PolicyDelete)
}
