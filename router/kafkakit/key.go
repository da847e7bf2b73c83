package kafkakit

import (
	"context"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

type keyCtxKey struct{}

// WithKey returns a copy of ctx that names key as the record key a message
// was read with, for a reader that does not go through watermill-kafka's
// subscriber (which records it itself).
func WithKey(ctx context.Context, key []byte) context.Context {
	return context.WithValue(ctx, keyCtxKey{}, key)
}

// KeyOf returns the record key msg was read with, and whether it was read
// from Kafka at all. A record without a key has a nil key.
func KeyOf(msg *message.Message) ([]byte, bool) {
	ctx := msg.Context()
	if key, ok := ctx.Value(keyCtxKey{}).([]byte); ok {
		return key, true
	}
	return kafka.MessageKeyFromCtx(ctx)
}

// KeepKeyMarshaler writes a copy of a consumed record under the key it was
// read with (a null key stays null), so that a dead letter or a replay of one
// purchase keeps its partition and its order. A message that was not read
// from Kafka is keyed by fallback.
type KeepKeyMarshaler struct {
	kafka.DefaultMarshaler
	Fallback kafka.GeneratePartitionKey
}

// Marshal is DefaultMarshaler's record (marshalRecord) with the original key.
func (m KeepKeyMarshaler) Marshal(topic string, msg *message.Message) (*sarama.ProducerMessage, error) {
	out, err := marshalRecord(topic, msg)
	if err != nil {
		return nil, err
	}
	if key, ok := KeyOf(msg); ok {
		if key != nil {
			out.Key = sarama.ByteEncoder(key)
		}
		return out, nil
	}
	key, err := m.Fallback(topic, msg)
	if err != nil {
		return nil, err
	}
	out.Key = sarama.StringEncoder(key)
	return out, nil
}
