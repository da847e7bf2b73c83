package middleware

import (
	"context"
	"sync"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Claims tracks the consumer-group session that owns each partition, so that
// Retry can tell when its message's partition was taken away. A rebalance ends
// the session; a retry that went on past it would keep ConsumeClaim from
// returning, stall the whole group until the rebalance timeout and get the
// member evicted. watermill-kafka derives a message's context from the
// subscription, not from the session, hence this record of sessions.
//
// It follows the session, not each claim, so it relies on an eager rebalance
// strategy, where every rebalance ends the session of every member; the
// catalog's subscriber pins one (router.NewConsumerGroupSubscriber).
type Claims struct {
	mu       sync.Mutex
	sessions map[claimKey]context.Context
}

type claimKey struct {
	topic     string
	partition int32
}

// NewClaims returns an empty record.
func NewClaims() *Claims { return &Claims{sessions: map[claimKey]context.Context{}} }

// Tracer is the hook to give a watermill-kafka subscriber
// (kafka.SubscriberConfig.Tracer): it records each claim's session, and
// tells onSession (when not nil) of each session the member starts: one at
// its first join and one per rebalance, the strategy being eager.
func (c *Claims) Tracer(onSession func()) kafka.SaramaTracer {
	return HandlerTracer(func(h sarama.ConsumerGroupHandler) sarama.ConsumerGroupHandler {
		return claimsHandler{ConsumerGroupHandler: h, claims: c, onSession: onSession}
	})
}

// Session is the context of the session that delivered msg, ended when the
// session ends, or nil for a message that no tracked claim delivered (a
// rebuild's replay, a test's direct call).
func (c *Claims) Session(msg *message.Message) context.Context {
	if c == nil {
		return nil
	}
	p, ok := kafka.MessagePartitionFromCtx(msg.Context())
	topic := message.SubscribeTopicFromCtx(msg.Context())
	if !ok || topic == "" {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sessions[claimKey{topic, p}]
}

func (c *Claims) claimed(topic string, partition int32, sess context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sessions[claimKey{topic, partition}] = sess
}

// HandlerTracer is a kafka.SaramaTracer that wraps the consumer-group
// handler and nothing else (a nil one wraps nothing): the hook by which the
// catalog watches its consumer-group sessions.
type HandlerTracer func(sarama.ConsumerGroupHandler) sarama.ConsumerGroupHandler

func (HandlerTracer) WrapConsumer(c sarama.Consumer) sarama.Consumer { return c }

func (HandlerTracer) WrapPartitionConsumer(pc sarama.PartitionConsumer) sarama.PartitionConsumer {
	return pc
}

func (HandlerTracer) WrapSyncProducer(_ *sarama.Config, p sarama.SyncProducer) sarama.SyncProducer {
	return p
}

func (f HandlerTracer) WrapConsumerGroupHandler(h sarama.ConsumerGroupHandler) sarama.ConsumerGroupHandler {
	if f == nil {
		return h
	}
	return f(h)
}

type claimsHandler struct {
	sarama.ConsumerGroupHandler
	claims    *Claims
	onSession func()
}

func (h claimsHandler) Setup(sess sarama.ConsumerGroupSession) error {
	if h.onSession != nil {
		h.onSession()
	}
	return h.ConsumerGroupHandler.Setup(sess)
}

func (h claimsHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	h.claims.claimed(claim.Topic(), claim.Partition(), sess.Context())
	return h.ConsumerGroupHandler.ConsumeClaim(sess, claim)
}
