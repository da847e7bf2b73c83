package router

import (
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/promoflow/promoflow/router/kafkakit"
)

// watermillLogger is the logger Watermill's components take.
type watermillLogger = watermill.LoggerAdapter

// NewConsumerGroupSubscriber is a Kafka subscriber of a consumer group that
// starts from the earliest offset when the group has none. tracer may be nil.
func NewConsumerGroupSubscriber(cluster kafkakit.Cluster, group string, wlog watermillLogger, tracer kafka.SaramaTracer) (*kafka.Subscriber, error) {
	sc := cluster.ClientConfig("promoflow-" + group)
	sc.Consumer.Return.Errors = true
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	// An eager strategy, where every rebalance ends the session: that end is
	// how middleware.Claims tells Retry that a partition was taken away. A
	// cooperative strategy (cooperative-sticky) keeps the session of a member
	// across rebalances and revokes partitions one by one, so a retry would go
	// on for a partition that moved. Pinned here, not left to Sarama's default.
	sc.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRange()}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: cluster.Brokers, Unmarshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc, ConsumerGroup: group,
		// A nack (a failed DLQ publish, a shutdown) redelivers after 1s, not in a hot loop.
		NackResendSleep: time.Second,
		Tracer:          tracer,
	}, wlog)
	if err != nil {
		return nil, fmt.Errorf("kafka subscriber %s: %w", group, err)
	}
	return sub, nil
}
