package kafkakit

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// BatchPublisher publishes the messages of one Publish call in one
// SendMessages of a durable producer (Cluster.DurableProducerConfig): one round trip
// for the batch instead of one per message. Each message stays one record,
// marshaled as watermill-kafka's Publisher would.
type BatchPublisher struct {
	producer  sarama.SyncProducer
	marshaler kafka.Marshaler
}

// NewBatchPublisher connects a durable producer to the cluster.
func NewBatchPublisher(cluster Cluster, clientID string, marshaler kafka.Marshaler) (*BatchPublisher, error) {
	producer, err := sarama.NewSyncProducer(cluster.Brokers, cluster.DurableProducerConfig(clientID))
	if err != nil {
		return nil, fmt.Errorf("kafka producer: %w", err)
	}
	return &BatchPublisher{producer: producer, marshaler: marshaler}, nil
}

// Publish sends msgs to topic and returns once Kafka has acknowledged every
// one, or an error. Within a partition the records keep the order of msgs
// (idempotent producer, one request in flight). When Kafka refuses some of
// them, the error is a *BatchError; the others are on Kafka, and its
// Delivered names those a resend may leave out.
func (p *BatchPublisher) Publish(topic string, msgs ...*message.Message) error {
	records := make([]*sarama.ProducerMessage, len(msgs))
	for i, msg := range msgs {
		r, err := p.marshaler.Marshal(topic, msg)
		if err != nil {
			return fmt.Errorf("marshal message %s: %w", msg.UUID, err)
		}
		r.Metadata = msg.UUID
		records[i] = r
	}
	err := p.producer.SendMessages(records)
	var perRecord sarama.ProducerErrors
	if errors.As(err, &perRecord) {
		be := &BatchError{Failed: make(map[string]error, len(perRecord)), Total: len(msgs)}
		for _, pe := range perRecord {
			uuid, _ := pe.Msg.Metadata.(string)
			be.Failed[uuid] = pe.Err
		}
		be.Delivered = delivered(records, be.Failed)
		return be
	}
	if err != nil {
		return fmt.Errorf("produce %d messages: %w", len(msgs), err)
	}
	return nil
}

// Close flushes and closes the producer.
func (p *BatchPublisher) Close() error {
	return p.producer.Close()
}

// BatchError is a batch that Kafka did not acknowledge whole.
type BatchError struct {
	// Failed maps the UUID of each message Kafka did not acknowledge to its error.
	Failed map[string]error
	// Delivered holds the UUID of each message Kafka acknowledged and that no
	// refused message of the same key precedes in the batch: a resend may
	// leave these out and still keep every key's order. (An acknowledged
	// message behind a refused one of its key goes again after it, so that the
	// key's last record stays its newest.)
	Delivered map[string]bool
	// Total is the size of the batch.
	Total int
}

// delivered is BatchError.Delivered of records, in the order they were sent.
func delivered(records []*sarama.ProducerMessage, failed map[string]error) map[string]bool {
	out := make(map[string]bool, len(records)-len(failed))
	refusedKeys := map[string]bool{}
	for _, r := range records {
		uuid, _ := r.Metadata.(string)
		var key string
		if r.Key != nil {
			b, _ := r.Key.Encode()
			key = string(b)
		}
		switch {
		case failed[uuid] != nil:
			refusedKeys[key] = true
		case r.Key == nil || !refusedKeys[key]:
			out[uuid] = true
		}
	}
	return out
}

func (e *BatchError) Error() string {
	var first error
	for _, err := range e.Failed {
		first = err
		break
	}
	return fmt.Sprintf("kafka refused %d of %d messages: %v", len(e.Failed), e.Total, first)
}

// MessageError is the outcome of one message of a Publish that returned err:
// nil when Kafka acknowledged that message although others failed.
func MessageError(err error, uuid string) error {
	var be *BatchError
	if errors.As(err, &be) {
		return be.Failed[uuid]
	}
	return err
}
