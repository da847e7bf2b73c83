package kafkakit

import (
	"errors"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Resender wraps a publisher whose partial failures are a *BatchError
// (BatchPublisher) for a caller that resends a refused call whole, as the
// outbox relay resends a refused outbox row: a call leaves out the messages
// that Kafka acknowledged in the calls before it (BatchError.Delivered), so
// that each acknowledged message is published once, however many times the
// others are resent while, say, a partition's leader is away.
//
// Its memory is bounded by one call: after each call it keeps only the
// acknowledged messages of that call, and none once a call succeeds whole.
// A call that names other messages (the caller moved on) forgets the rest.
type Resender struct {
	message.Publisher

	mu    sync.Mutex
	acked map[string]bool
}

// NewResender wraps pub.
func NewResender(pub message.Publisher) *Resender {
	return &Resender{Publisher: pub}
}

// Publish publishes the messages of msgs that Kafka has not acknowledged yet,
// in order. It returns nil once every message of msgs is on Kafka.
func (r *Resender) Publish(topic string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	send := make([]*message.Message, 0, len(msgs))
	for _, m := range msgs {
		if !r.acked[m.UUID] {
			send = append(send, m)
		}
	}
	var err error
	if len(send) > 0 {
		err = r.Publisher.Publish(topic, send...)
	}
	if err == nil {
		r.acked = nil
		return nil
	}
	var be *BatchError
	partial := errors.As(err, &be)
	acked := map[string]bool{}
	for _, m := range msgs {
		if r.acked[m.UUID] || (partial && be.Delivered[m.UUID]) {
			acked[m.UUID] = true
		}
	}
	r.acked = acked
	return err
}
