package kafkakit

import (
	"context"
	"errors"
	"fmt"

	"github.com/IBM/sarama"
)

// TopicState is a topic as the cluster has it now.
type TopicState struct {
	// Missing is set when the cluster has no such topic.
	Missing bool
	// Partitions is its partition count.
	Partitions int32
	// Policies is its cleanup.policy, e.g. ["compact"].
	Policies []string
}

// DescribeTopic reads a topic's partition count and cleanup policy, or that
// it is missing, never creating it (an admin metadata request does not ask
// the broker to). It answers within ProbeTimeout, or when ctx ends.
func (c Cluster) DescribeTopic(ctx context.Context, topic string) (TopicState, error) {
	return askAdmin(ctx, c, func(admin sarama.ClusterAdmin) (TopicState, error) { return describeTopic(admin, topic) })
}

// askAdmin runs f on an admin of short timeouts, and answers within
// ProbeTimeout, or when ctx ends.
func askAdmin[T any](ctx context.Context, c Cluster, f func(sarama.ClusterAdmin) (T, error)) (T, error) {
	res := make(chan T, 1) // a call that timed out writes to no one
	err := c.within(ctx, func(string) error {
		sc := c.ClientConfig("promoflow-topic-check")
		sc.Net.DialTimeout, sc.Net.ReadTimeout, sc.Net.WriteTimeout = probeIOTimeout, probeIOTimeout, probeIOTimeout
		admin, err := sarama.NewClusterAdmin(c.Brokers, sc)
		if err != nil {
			return fmt.Errorf("connect kafka admin: %w", err)
		}
		defer admin.Close()
		v, err := f(admin)
		res <- v
		return err
	})
	if err != nil {
		select {
		case v := <-res: // f's own answer beside its error
			return v, err
		default:
			var zero T
			return zero, err
		}
	}
	return <-res, nil
}

func describeTopic(admin sarama.ClusterAdmin, topic string) (TopicState, error) {
	meta, err := admin.DescribeTopics([]string{topic})
	if err == nil && len(meta) != 1 {
		err = fmt.Errorf("%d results for one topic", len(meta))
	}
	if err != nil {
		return TopicState{}, fmt.Errorf("describe topic %s: %w", topic, err)
	}
	switch meta[0].Err {
	case sarama.ErrNoError:
	case sarama.ErrUnknownTopicOrPartition:
		return TopicState{Missing: true}, nil
	default:
		return TopicState{}, fmt.Errorf("describe topic %s: %w", topic, meta[0].Err)
	}
	policies, err := CleanupPolicies(admin, topic)
	if errors.Is(err, sarama.ErrUnknownTopicOrPartition) { // deleted since
		return TopicState{Missing: true}, nil
	}
	if err != nil {
		return TopicState{}, err
	}
	return TopicState{Partitions: int32(len(meta[0].Partitions)), Policies: policies}, nil
}
