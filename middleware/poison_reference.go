package middleware

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"

	"github.com/promoflow/promoflow/handlers/event"
)

// Metadata keys of a dead letter by reference: a record too large to carry
// whole stays in its source topic, and the DLQ names it.
const (
	// HeaderDLQByReference is "true" on a dead letter that carries no value:
	// x-source-topic, x-original-partition and x-original-offset name the
	// record, and a replay fetches it from there.
	HeaderDLQByReference = "x-dlq-by-reference"
	// HeaderDLQValueSize is the size in bytes of the record's value.
	HeaderDLQValueSize = "x-dlq-value-size"
	// HeaderDLQValueSHA256 is the hex SHA-256 of the record's value: a replay
	// forwards only the record that has it.
	HeaderDLQValueSHA256 = "x-dlq-value-sha256"
)

// ErrNoReference is a dead letter too large for the DLQ whose record has no
// Kafka position to refer to.
var ErrNoReference = errors.New("dead letter does not fit the dlq and names no source offset")

// referenceHeaders are what a dead letter by reference keeps of its headers
// when all of them do not fit: its own, what the replay filters and counts
// by, and the trace context (the propagator's fields).
func referenceHeaders() []string {
	return append([]string{HeaderDLQReason, HeaderDLQErrorCode, HeaderSourceTopic, HeaderOriginalPartition,
		HeaderOriginalOffset, HeaderDLQByReference, HeaderDLQValueSize, HeaderDLQValueSHA256, HeaderDLQReplayCount,
		event.HeaderAggregateID, event.HeaderCorrelationID}, otel.GetTextMapPropagator().Fields()...)
}

// byReference is dlq without its value, naming the record it stands for.
// It keeps every header when they fit, else only referenceHeaders.
func byReference(msg, dlq *message.Message, fits func(*message.Message) bool) (*message.Message, error) {
	if dlq.Metadata.Get(HeaderSourceTopic) == "" || dlq.Metadata.Get(HeaderOriginalPartition) == "" ||
		dlq.Metadata.Get(HeaderOriginalOffset) == "" {
		return nil, fmt.Errorf("%w: %s is %d bytes", ErrNoReference, msg.UUID, len(msg.Payload))
	}
	sum := sha256.Sum256(msg.Payload)
	ref := message.NewMessage(dlq.UUID, message.Payload{})
	ref.Metadata = maps.Clone(dlq.Metadata)
	ref.Metadata.Set(HeaderDLQByReference, "true")
	ref.Metadata.Set(HeaderDLQValueSize, strconv.Itoa(len(msg.Payload)))
	ref.Metadata.Set(HeaderDLQValueSHA256, hex.EncodeToString(sum[:]))
	ref.SetContext(dlq.Context())
	if fits(ref) {
		return ref, nil
	}
	keep := message.Metadata{}
	for _, k := range referenceHeaders() {
		if v, ok := ref.Metadata[k]; ok {
			keep[k] = v
		}
	}
	ref.Metadata = keep
	return ref, nil
}
