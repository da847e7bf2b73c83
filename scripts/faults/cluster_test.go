//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/promoflow/promoflow/router/kafkakit"
)

// The fault stack's Kafka (scripts/stack.sh with PROMOFLOW_KAFKA_NODES=3):
// brokers 1..3 and the controllers 101..103 of a KRaft quorum, each a
// process of its own that the suite kills, stops and starts by node id.

// service is the stack.sh name of a node.
func service(node int32) string {
	if node > 100 {
		return fmt.Sprintf("controller:%d", node-100)
	}
	return fmt.Sprintf("kafka:%d", node)
}

// nodes runs stack.sh verb (kill, down, up) on the nodes.
func (s *suite) nodes(t *testing.T, verb string, nodes ...int32) {
	t.Helper()
	args := []string{verb}
	for _, n := range nodes {
		args = append(args, service(n))
	}
	s.stack(t, args...)
}

// clusterConfig is a client config that gives up on a dead broker fast.
func (s *suite) clusterConfig() *sarama.Config {
	sc := s.cluster().ClientConfig("promoflow-faults-cluster")
	sc.Net.DialTimeout, sc.Net.ReadTimeout, sc.Net.WriteTimeout = 5*time.Second, 10*time.Second, 10*time.Second
	sc.Metadata.Retry.Max = 1
	return sc
}

func (s *suite) admin() (sarama.ClusterAdmin, error) {
	return sarama.NewClusterAdmin(s.cluster().Brokers, s.clusterConfig())
}

// partition is a partition's leader and replicas, as the metadata says.
type partition struct {
	id       int32
	leader   int32 // -1: none
	replicas []int32
	isr      []int32
}

// partitions reads the topic's partitions from whichever broker answers.
func (s *suite) partitions(topic string) ([]partition, error) {
	admin, err := s.admin()
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	md, err := admin.DescribeTopics([]string{topic})
	if err == nil && (len(md) != 1 || md[0].Err != sarama.ErrNoError) {
		err = fmt.Errorf("describe %s: %v", topic, md)
	}
	if err != nil {
		return nil, err
	}
	out := make([]partition, len(md[0].Partitions))
	for i, p := range md[0].Partitions {
		out[i] = partition{id: p.ID, leader: p.Leader, replicas: p.Replicas, isr: p.Isr}
	}
	return out, nil
}

// leaderOfMost is the broker that leads most of the topic's partitions, and how many.
func (s *suite) leaderOfMost(topic string) (broker int32, led int, err error) {
	parts, err := s.partitions(topic)
	if err != nil {
		return 0, 0, err
	}
	count := map[int32]int{}
	for _, p := range parts {
		count[p.leader]++
	}
	for b, n := range count {
		if n > led || (n == led && b < broker) {
			broker, led = b, n
		}
	}
	return broker, led, nil
}

// isrSizes is the smallest and largest ISR over the topic's partitions, and
// how many partitions have no leader or a leader among gone.
func (s *suite) isrSizes(topic string, gone ...int32) (smallest, largest, leaderless int, err error) {
	parts, err := s.partitions(topic)
	if err != nil {
		return 0, 0, 0, err
	}
	smallest = 1 << 30
	for _, p := range parts {
		smallest, largest = min(smallest, len(p.isr)), max(largest, len(p.isr))
		if p.leader < 0 || slices.Contains(gone, p.leader) {
			leaderless++
		}
	}
	return smallest, largest, leaderless, nil
}

// waitISR waits until every partition of the topic has a leader outside
// gone and an ISR of exactly size, and returns how long that took; a
// violation when it did not within timeout.
func (e *env) waitISR(size int, timeout time.Duration, gone ...int32) time.Duration {
	var smallest, largest, leaderless int
	var err error
	took, ok := eventually(e.ctx, timeout, func() bool {
		smallest, largest, leaderless, err = e.s.isrSizes(e.topic, gone...)
		return err == nil && smallest == size && largest == size && leaderless == 0
	})
	if !ok {
		e.violate("partitions of %s did not all get a leader and an ISR of %d within %s: ISR %d..%d, %d without a live leader (%v)",
			e.topic, size, timeout, smallest, largest, leaderless, err)
	}
	return took
}

// checkReplication wants the purchase topic, the DLQ and the replay topic
// created with three replicas, two of them in sync for a write
// (kafkakit.ReplicationFor the cluster).
func (e *env) checkReplication() {
	for _, topic := range []string{e.topic, e.dlq, e.replay} {
		e.checkTopicReplication(topic)
	}
}

// checkTopicReplication: every partition of topic has three replicas, and
// the topic takes a write with two in sync.
func (e *env) checkTopicReplication(topic string) {
	parts, err := e.s.partitions(topic)
	if err != nil {
		e.violate("replication of %s: %v", topic, err)
		return
	}
	for _, p := range parts {
		if len(p.replicas) != 3 {
			e.violate("%s/%d has %d replicas, want 3", topic, p.id, len(p.replicas))
			return
		}
	}
	admin, err := e.s.admin()
	if err != nil {
		e.violate("replication of %s: %v", topic, err)
		return
	}
	defer admin.Close()
	configs, err := kafkakit.TopicConfigs(admin, topic, "min.insync.replicas")
	if err != nil || configs["min.insync.replicas"] != "2" {
		e.violate("%s: min.insync.replicas %q, want 2 (%v)", topic, configs["min.insync.replicas"], err)
	}
}

// activeController asks the quorum (DescribeQuorum, through a broker) which
// controller leads it.
func (s *suite) activeController(ctx context.Context) (int32, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.cluster().Brokers...), kgo.DialTimeout(5*time.Second))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req := kmsg.NewPtrDescribeQuorumRequest()
	topic := kmsg.NewDescribeQuorumRequestTopic()
	topic.Topic = "__cluster_metadata"
	part := kmsg.NewDescribeQuorumRequestTopicPartition()
	topic.Partitions = append(topic.Partitions, part)
	req.Topics = append(req.Topics, topic)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, fmt.Errorf("describe quorum: %w", err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return 0, fmt.Errorf("describe quorum: %w", err)
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return 0, errors.New("describe quorum: no partition in the answer")
	}
	p := resp.Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
		return 0, fmt.Errorf("describe quorum: %w", err)
	}
	if p.LeaderID < 0 {
		return 0, errors.New("describe quorum: no leader")
	}
	return p.LeaderID, nil
}

// coordinator is the broker that coordinates the group.
func (s *suite) coordinator(group string) (int32, error) {
	client, err := sarama.NewClient(s.cluster().Brokers, s.clusterConfig())
	if err != nil {
		return 0, err
	}
	defer client.Close()
	if err := client.RefreshCoordinator(group); err != nil {
		return 0, err
	}
	b, err := client.Coordinator(group)
	if err != nil {
		return 0, err
	}
	return b.ID(), nil
}

// groupState is the group's state (Stable, PreparingRebalance, ...) and members.
func (s *suite) groupState(group string) (string, int, error) {
	admin, err := s.admin()
	if err != nil {
		return "", 0, err
	}
	defer admin.Close()
	groups, err := admin.DescribeConsumerGroups([]string{group})
	if err == nil && len(groups) != 1 {
		err = fmt.Errorf("describe group %s: %d answers", group, len(groups))
	}
	if err == nil && groups[0].Err != sarama.ErrNoError {
		err = groups[0].Err
	}
	if err != nil {
		return "", 0, err
	}
	return groups[0].State, len(groups[0].Members), nil
}

// relayedTotal sums promotion_outbox_relayed_total over the running
// promotion processes.
func (e *env) relayedTotal() float64 {
	var sum float64
	for _, p := range e.promotions {
		if !p.alive() {
			continue
		}
		if v, err := metric(p, "promotion_outbox_relayed_total"); err == nil {
			sum += v
		}
	}
	return sum
}

// sumMetric sums a series over procs; an error when one does not answer.
func sumMetric(procs []*proc, name string) (float64, error) {
	var sum float64
	for _, p := range procs {
		v, err := metric(p, name)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

// waitRelayed waits until the promotion processes relayed more than from
// events, and returns how long that took; a violation when they did not
// within timeout.
func (e *env) waitRelayed(from float64, timeout time.Duration, while string) time.Duration {
	took, ok := eventually(e.ctx, timeout, func() bool { return e.relayedTotal() > from })
	if !ok {
		e.violate("the relay published nothing %s within %s", while, timeout)
	}
	return took
}

// brokersList is the brokers' node ids.
func (s *suite) brokerIDs() []int32 {
	ids := make([]int32, len(strings.Split(s.brokers, ",")))
	for i := range ids {
		ids[i] = int32(i + 1)
	}
	return ids
}
