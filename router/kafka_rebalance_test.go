package router_test

import (
	"context"
	"sync"
	"sync/atomic"
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
// and the first member's session ends. The first member counts a session at
// its join and one at the rebalance (catalog_promotion_group_sessions_total).
func TestConsumerGroupSubscriber_EveryRebalanceEndsTheSessionClaimsFollows(t *testing.T) {
	t.Parallel()
	topic := kafkatest.Topic(t, 2)
	group := "pf-test-" + kafkatest.RandomSuffix()
	claims := middleware.NewClaims()
	sessions := make(chan context.Context, 64)
	var started atomic.Int64
	runMember(t, topic, group, claims, func() { started.Add(1) }, func(msg *message.Message) error {
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

	require.EqualValues(t, 1, started.Load(), "one session since the first join")

	runMember(t, topic, group, middleware.NewClaims(), nil, func(*message.Message) error { return nil })
	require.Eventually(t, func() bool { return first.Err() != nil }, 30*time.Second, 10*time.Millisecond,
		"a second member joined, and the first member's session did not end: the rebalance strategy is not eager")
	require.Eventually(t, func() bool { return started.Load() == 2 }, 30*time.Second, 10*time.Millisecond,
		"the rebalance started the first member's second session")
}

// runMember consumes topic as a member of group through the catalog's
// subscriber, with claims recording its sessions and onSession told of
// each, until the test ends.
func runMember(t *testing.T, topic, group string, claims *middleware.Claims, onSession func(), h message.NoPublishHandlerFunc) {
	t.Helper()
	sub, err := router.NewConsumerGroupSubscriber(kafkatest.Cluster(t), group, router.ConsumerBuffers{}, watermill.NopLogger{}, claims.Tracer(onSession))
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
