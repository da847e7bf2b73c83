package router_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestConsumerGroupSubscriber_EveryRebalanceEndsTheSessionClaimsFollows:
// middleware.Claims tells Retry that a partition was taken away by the end
// of the consumer-group session that delivered it. That holds with an eager
// rebalance strategy only, where every rebalance ends the session; with a
// cooperative one, the session of a member that keeps partitions survives
// the rebalance, and Retry would retry on past a partition that moved. The
// catalog's subscriber must keep an eager strategy: a second member joins,
// and the first member's session ends.
func TestConsumerGroupSubscriber_EveryRebalanceEndsTheSessionClaimsFollows(t *testing.T) {
	t.Parallel()
	topic := kafkatest.Topic(t, 2)
	group := "pf-test-" + kafkatest.RandomSuffix()
	claims := middleware.NewClaims()
	sessions := make(chan context.Context, 64)
	runMember(t, topic, group, claims, func(msg *message.Message) error {
		if s := claims.Session(msg); s != nil {
			sessions <- s
		}
		return nil
	})
	pub := kafkaPublisherOf(t)
	for range 10 {
		require.NoError(t, pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(`{}`))))
	}
	var first context.Context
	select {
	case first = <-sessions:
	case <-time.After(30 * time.Second):
		t.Fatal("the first member consumed nothing")
	}

	runMember(t, topic, group, middleware.NewClaims(), func(*message.Message) error { return nil })
	require.Eventually(t, func() bool { return first.Err() != nil }, 30*time.Second, 10*time.Millisecond,
		"a second member joined, and the first member's session did not end: the rebalance strategy is not eager")
}

// runMember consumes topic as a member of group through the catalog's
// subscriber, with claims recording its sessions, until the test ends.
func runMember(t *testing.T, topic, group string, claims *middleware.Claims, h message.NoPublishHandlerFunc) {
	t.Helper()
	sub, err := router.NewConsumerGroupSubscriber(kafkatest.Cluster(t), group, router.ConsumerBuffers{}, watermill.NopLogger{}, claims.Tracer())
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddConsumerHandler("member", topic, sub, h)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	<-r.Running()
}

// kafkaPublisherOf publishes keyed by message UUID, spreading messages over
// partitions.
func kafkaPublisherOf(t *testing.T) message.Publisher {
	t.Helper()
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: kafkatest.Brokers(t),
		Marshaler: kafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
			return m.UUID, nil
		}),
		OverwriteSaramaConfig: kafkatest.Cluster(t).DurableProducerConfig("test"),
	}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}
