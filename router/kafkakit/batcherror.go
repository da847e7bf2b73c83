package kafkakit

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"
)

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
