package kafkakit

import (
	"sync"

	"github.com/IBM/sarama"
)

// Remembered is how many acknowledged messages r keeps for its next call.
func (r *Resender) Remembered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.acked)
}

// HoldSends makes p's next send wait until release is called; the Publish
// meanwhile times out as it would against a cluster that does not answer.
// release returns once that send has ended, with its error.
func (p *BatchPublisher) HoldSends() (release func() error) {
	gate, ended := make(chan struct{}), make(chan error, 1)
	send := p.send
	var once sync.Once
	p.send = func(c *producerConn, records []*sarama.ProducerMessage) error {
		held := false
		once.Do(func() { held = true })
		if !held {
			return send(c, records)
		}
		<-gate
		err := send(c, records)
		ended <- err
		return err
	}
	return func() error {
		close(gate)
		return <-ended
	}
}
