package router_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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

// TestReadAhead_ARebalanceWhileRecordsWaitForTheBudget: a member's read-ahead
// is full and its next records wait for the budget when a second member
// joins. The rebalance ends the first member's session; its claims return
// and leave their queued records unhandled, so no handler releases them,
// and Sarama cannot close a partition consumer whose record waits. The
// session's end must free the wait: the group then settles within the
// rebalance, not after the first member is evicted (a minute), every record
// is handled, and both members close.
func TestReadAhead_ARebalanceWhileRecordsWaitForTheBudget(t *testing.T) {
	t.Parallel()
	const records, budget = 2_000, 16 << 10
	topic := kafkatest.Topic(t, 4)
	group := "pf-test-" + kafkatest.RandomSuffix()
	pub := kafkaPublisherOf(t)
	value := []byte(fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", 2000)))
	var msgs []*message.Message
	for range records {
		msgs = append(msgs, message.NewMessage(watermill.NewUUID(), value))
	}
	require.NoError(t, pub.Publish(topic, msgs...))

	var handled sync.Map // partition/offset → true
	var count atomic.Int64
	note := func(msg *message.Message) {
		p, _ := kafka.MessagePartitionFromCtx(msg.Context())
		o, _ := kafka.MessagePartitionOffsetFromCtx(msg.Context())
		if _, seen := handled.LoadOrStore(fmt.Sprint(p, "/", o), true); !seen {
			count.Add(1)
		}
	}
	hold := make(chan struct{})
	claims := middleware.NewClaims()
	var firstSession atomic.Pointer[context.Context]
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "read_ahead_bytes"})
	stopFirst := runMemberWith(t, topic, group, router.ConsumerBuffers{ReadAheadBytes: budget}, gauge, claims.Tracer(nil),
		func(msg *message.Message) error {
			if s := claims.Session(msg); s != nil {
				firstSession.CompareAndSwap(nil, &s)
			}
			<-hold
			note(msg)
			return nil
		})
	require.Eventually(t, func() bool { return testutil.ToFloat64(gauge) > budget/2 }, 30*time.Second, 5*time.Millisecond,
		"the first member's read-ahead never filled")
	require.LessOrEqual(t, testutil.ToFloat64(gauge), float64(budget), "the read-ahead passed its budget")

	stopSecond := runMemberWith(t, topic, group, router.ConsumerBuffers{}, nil, nil,
		func(msg *message.Message) error { note(msg); return nil })
	require.Eventually(t, func() bool { s := firstSession.Load(); return s != nil && (*s).Err() != nil },
		30*time.Second, 5*time.Millisecond, "the second member's join did not end the first member's session")
	close(hold)

	require.Eventually(t, func() bool { return count.Load() == records }, 40*time.Second, 10*time.Millisecond,
		"records handled: the group did not settle while the first member's records waited for its budget")
	stopFirst()
	stopSecond()
	require.Zero(t, testutil.ToFloat64(gauge), "the closed member still counts records read ahead")
}

// runMember consumes topic as a member of group through the catalog's
// subscriber, with claims recording its sessions and onSession told of
// each, until the test ends.
func runMember(t *testing.T, topic, group string, claims *middleware.Claims, onSession func(), h message.NoPublishHandlerFunc) {
	t.Helper()
	runMemberWith(t, topic, group, router.ConsumerBuffers{}, nil, claims.Tracer(onSession), h)
}

// runMemberWith is runMember with buffers, a gauge of the bytes it reads
// ahead (may be nil) and a tracer of its own. It returns a stop that fails
// the test if the member does not close within a minute; the test's end
// stops it too.
func runMemberWith(t *testing.T, topic, group string, buffers router.ConsumerBuffers, gauge prometheus.Gauge,
	tracer kafka.SaramaTracer, h message.NoPublishHandlerFunc) (stop func()) {
	t.Helper()
	sub, readAhead, err := router.NewConsumerGroupSubscriber(kafkatest.Cluster(t), group, buffers, watermill.NopLogger{}, tracer, gauge, nil)
	require.NoError(t, err)
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	r.AddConsumerHandler("member", topic, sub, h).AddMiddleware(readAhead)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(time.Minute):
				t.Errorf("the member of %s did not close within a minute", group)
			}
		})
	}
	t.Cleanup(stop)
	<-r.Running()
	return stop
}

// kafkaPublisherOf publishes keyed by message UUID, spreading messages over
// partitions.
func kafkaPublisherOf(t *testing.T) message.Publisher {
	t.Helper()
	return kafkaPublisherKeyed(t, func(m *message.Message) string { return m.UUID })
}

// kafkaPublisherKeyed publishes each message under the key key gives it.
func kafkaPublisherKeyed(t *testing.T, key func(*message.Message) string) message.Publisher {
	t.Helper()
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: kafkatest.Brokers(t),
		Marshaler: kafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
			return key(m), nil
		}),
		OverwriteSaramaConfig: kafkatest.Cluster(t).DurableProducerConfig("test"),
	}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}
