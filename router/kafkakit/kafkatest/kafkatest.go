// Package kafkatest gives each test Kafka topics of its own on the real
// broker named by KAFKA_BROKERS (scripts/test.sh starts it), and reads them.
// Nothing here fakes Kafka.
package kafkatest

import (
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit"
)

// RandomSuffix is a short random string for topic and group names.
func RandomSuffix() string { return strconv.FormatUint(rand.Uint64(), 36) }

// Brokers are the Kafka bootstrap servers of $KAFKA_BROKERS.
func Brokers(t testing.TB) []string {
	t.Helper()
	brokers := os.Getenv("KAFKA_BROKERS")
	if brokers == "" {
		t.Fatal("$KAFKA_BROKERS is not set: run the tests with scripts/test.sh, which starts Kafka")
	}
	return strings.Split(brokers, ",")
}

// Cluster is the plaintext cluster of $KAFKA_BROKERS.
func Cluster(t testing.TB) kafkakit.Cluster {
	t.Helper()
	return kafkakit.Cluster{Brokers: Brokers(t)}
}

// Topic creates a topic of the test's own with the given partitions and the
// broker's default cleanup policy (delete).
func Topic(t testing.TB, partitions int32) string {
	t.Helper()
	return TopicWith(t, kafkakit.Topic{Partitions: partitions})
}

// TopicWith creates a topic of the test's own as spec says; its name is
// filled in, and a replication that follows the cluster when spec has none.
func TopicWith(t testing.TB, spec kafkakit.Topic) string {
	t.Helper()
	spec.Name = "pf-test-" + RandomSuffix()
	_, err := kafkakit.EnsureTopics(Cluster(t), spec)
	require.NoError(t, err)
	t.Cleanup(func() { deleteTopic(Cluster(t), spec.Name) })
	waitForLeaders(t, spec.Name, spec.Partitions)
	return spec.Name
}

// TopicConfigured creates a topic of the test's own with the given
// partitions and topic configs (such as max.message.bytes), in effect from
// its first record.
func TopicConfigured(t testing.TB, partitions int32, configs map[string]string) string {
	t.Helper()
	name := "pf-test-" + RandomSuffix()
	entries := make(map[string]*string, len(configs))
	for k, v := range configs {
		entries[k] = &v
	}
	admin, err := sarama.NewClusterAdmin(Brokers(t), Cluster(t).ClientConfig("promoflow-test"))
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1,
		ConfigEntries: entries}, false))
	t.Cleanup(func() { deleteTopic(Cluster(t), name) })
	waitForLeaders(t, name, partitions)
	return name
}

// SetTopicConfig sets one config of a topic and waits until the broker
// reports it.
func SetTopicConfig(t testing.TB, topic, key, value string) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(Brokers(t), Cluster(t).ClientConfig("promoflow-test"))
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, admin.IncrementalAlterConfig(sarama.TopicResource, topic, map[string]sarama.IncrementalAlterConfigsEntry{
		key: {Operation: sarama.IncrementalAlterConfigsOperationSet, Value: &value}}, false))
	require.Eventually(t, func() bool {
		entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: topic, ConfigNames: []string{key}})
		return err == nil && len(entries) == 1 && entries[0].Value == value
	}, 30*time.Second, 50*time.Millisecond, "topic %s: %s is not %s", topic, key, value)
}

// CleanupTopic deletes a topic that the code under test created when the test ends.
func CleanupTopic(t testing.TB, name string) {
	t.Cleanup(func() { deleteTopic(Cluster(t), name) })
}

// waitForLeaders waits until every partition of a new topic has a leader that
// serves it; a fresh broker may answer NotLeaderForPartition for a moment.
func waitForLeaders(t testing.TB, topic string, partitions int32) {
	t.Helper()
	client, err := sarama.NewClient(Brokers(t), Cluster(t).ClientConfig("promoflow-test"))
	require.NoError(t, err)
	defer client.Close()
	require.Eventually(t, func() bool {
		if client.RefreshMetadata(topic) != nil {
			return false
		}
		for p := range partitions {
			if _, err := client.GetOffset(topic, p, sarama.OffsetNewest); err != nil {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "topic %s has no leaders", topic)
}

// deleteTopic removes a test's topic, best effort, so that test runs do not
// fill the broker's disk.
func deleteTopic(cluster kafkakit.Cluster, name string) {
	admin, err := sarama.NewClusterAdmin(cluster.Brokers, cluster.ClientConfig("promoflow-test"))
	if err != nil {
		return
	}
	defer admin.Close()
	_ = admin.DeleteTopic(name)
}

// ReadTopic consumes every partition of topic from the oldest offset until done
// returns true for what has arrived, or fails the test after timeout.
func ReadTopic(t testing.TB, topic string, timeout time.Duration, done func([]*sarama.ConsumerMessage) bool) []*sarama.ConsumerMessage {
	t.Helper()
	got, ok := ReadTopicWithin(t, topic, timeout, done)
	if !ok {
		t.Fatalf("topic %s: condition not met within %s; %d records arrived", topic, timeout, len(got))
	}
	return got
}

// ReadTopicWithin is ReadTopic that returns what arrived and false after
// timeout, for a test that says itself what is missing.
func ReadTopicWithin(t testing.TB, topic string, timeout time.Duration, done func([]*sarama.ConsumerMessage) bool) ([]*sarama.ConsumerMessage, bool) {
	t.Helper()
	consumer, err := sarama.NewConsumer(Brokers(t), Cluster(t).ClientConfig("promoflow-test"))
	require.NoError(t, err)
	defer consumer.Close()
	parts, err := consumer.Partitions(topic)
	require.NoError(t, err)

	in := make(chan *sarama.ConsumerMessage, 1024)
	for _, p := range parts {
		var pc sarama.PartitionConsumer
		// A topic made by the code under test may not have its leader yet.
		require.Eventually(t, func() bool {
			pc, err = consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
			return err == nil
		}, 30*time.Second, 50*time.Millisecond, "consume %s/%d", topic, p)
		defer pc.Close()
		go func() {
			for m := range pc.Messages() {
				in <- m
			}
		}()
	}
	var got []*sarama.ConsumerMessage
	deadline := time.After(timeout)
	for !done(got) {
		select {
		case m := <-in:
			got = append(got, m)
		case <-deadline:
			return got, false
		}
	}
	return got, true
}

// Header returns a record header's value.
func Header(m *sarama.ConsumerMessage, key string) string {
	for _, h := range m.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}
