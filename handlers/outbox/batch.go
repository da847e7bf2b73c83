package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/promoflow/promoflow/handlers/event"
)

// EventsMetadataKey marks an outbox message that carries a batch of events;
// its value is how many. The row's metadata column holds it too, so that the
// backlog and the relayed counter count events without decoding payloads.
const EventsMetadataKey = "outbox_events"

// OffsetMetadataKey carries, on a message the relay read, the offset (id in
// MessagesTable) of its row, or of the last row of a merged group; of the
// unreadable row when the message is one (ErrUnreadable).
const OffsetMetadataKey = "outbox_offset"

// unreadableKey marks a message the relay read from a row it cannot read;
// its value says why.
const unreadableKey = "outbox_unreadable"

// ErrUnreadable is an outbox row the relay cannot unwrap into its events. The
// relay stops at it, keeping the order of the rows behind it, until the row is
// repaired (docs/runbooks/outbox-backlog.md).
var ErrUnreadable = errors.New("unreadable outbox row")

// MaxEventsPerRow is the most events one outbox row carries; a transaction
// that writes more fills several rows. It bounds the row the relay holds in
// memory and sends to Kafka in one request.
const MaxEventsPerRow = 500

// packedEvent is one event inside a batch payload of the first layout, a
// JSON array of them: the message as the Kafka publisher will see it. Rows
// written so by an earlier release are still read (Unpack, merge).
type packedEvent struct {
	UUID     string           `json:"uuid"`
	Payload  []byte           `json:"payload"`
	Metadata message.Metadata `json:"metadata"`
}

// sharedKeyPrefix leads, in a framed batch's metadata, each trace header
// (event.TraceHeaders) that all its events carry with one value, which
// their frames leave out: an expirer batch's 200 events share their writer's
// span, and its trace context written 200 times cost the relay 8 % of
// its throughput, in the outbox row, the forwarder's envelope and the
// frames. Only trace headers are shared: a relay of a release before them
// relays every event whole, without its trace context.
const sharedKeyPrefix = "outbox_shared_"

// sharedTrace is the trace headers that every one of msgs, two or more,
// carries with one value.
func sharedTrace(msgs []*message.Message) message.Metadata {
	if len(msgs) < 2 {
		return nil
	}
	var shared message.Metadata
	for _, k := range event.TraceHeaders {
		v, ok := msgs[0].Metadata[k]
		if !ok || slices.ContainsFunc(msgs[1:], func(m *message.Message) bool {
			w, ok := m.Metadata[k]
			return !ok || w != v
		}) {
			continue
		}
		if shared == nil {
			shared = message.Metadata{}
		}
		shared[k] = v
	}
	return shared
}

// sharedOf is the pairs a framed batch's metadata shares with each of its
// events (sharedKeyPrefix), without the prefix.
func sharedOf(batch message.Metadata) message.Metadata {
	var shared message.Metadata
	for _, k := range event.TraceHeaders {
		if v, ok := batch[sharedKeyPrefix+k]; ok {
			if shared == nil {
				shared = message.Metadata{}
			}
			shared[k] = v
		}
	}
	return shared
}

// pack makes one message of msgs, in order, in the framed layout
// (framesMagic), with their shared trace headers in its metadata.
func pack(msgs []*message.Message) *message.Message {
	shared := sharedTrace(msgs)
	payload := slices.Clone(framesMagic)
	for _, m := range msgs {
		payload = appendFrame(payload, m, shared)
	}
	// No aggregate_id: a relay of a release before batches cannot key the
	// batch, so it retries it instead of publishing it as one record. A relay
	// of a release before the framed layout refuses it as unreadable and
	// stops there (docs/runbooks/outbox-backlog.md).
	batch := message.NewMessage(watermill.NewUUID(), payload)
	batch.Metadata.Set(EventsMetadataKey, strconv.Itoa(len(msgs)))
	for k, v := range shared {
		batch.Metadata.Set(sharedKeyPrefix+k, v)
	}
	return batch
}

// Unpack returns the events msg carries, in the order they were written, each
// with msg's context. A message without EventsMetadataKey is one event: a row
// written before batches existed.
// A message it cannot unwrap is an ErrUnreadable.
func Unpack(msg *message.Message) ([]*message.Message, error) {
	if reason := msg.Metadata.Get(unreadableKey); reason != "" {
		return nil, fmt.Errorf("%w: %s", ErrUnreadable, reason)
	}
	if msg.Metadata.Get(EventsMetadataKey) == "" {
		return []*message.Message{msg}, nil
	}
	want := EventCount(msg)
	if isFramed(msg.Payload) {
		out, err := decodeFrames(msg.Payload, want, sharedOf(msg.Metadata))
		if err != nil {
			return nil, fmt.Errorf("%w: batch %s: %w", ErrUnreadable, msg.UUID, err)
		}
		for _, e := range out {
			e.SetContext(msg.Context())
		}
		return out, nil
	}
	var events []packedEvent
	if err := json.Unmarshal(msg.Payload, &events); err != nil {
		return nil, fmt.Errorf("%w: batch %s: %w", ErrUnreadable, msg.UUID, err)
	}
	if want != len(events) {
		return nil, fmt.Errorf("%w: batch %s: %d events, %d announced", ErrUnreadable, msg.UUID, len(events), want)
	}
	out := make([]*message.Message, len(events))
	for i, e := range events {
		out[i] = message.NewMessage(e.UUID, e.Payload)
		maps.Copy(out[i].Metadata, e.Metadata)
		out[i].SetContext(msg.Context())
	}
	return out, nil
}

// EventCount is how many events an outbox row or batch message carries.
func EventCount(msg *message.Message) int {
	n, err := strconv.Atoi(msg.Metadata.Get(EventsMetadataKey))
	if err != nil {
		return 1
	}
	return n
}

// Unpacker is the relay's publisher: the events of each outbox message go to
// the wrapped publisher in one Publish call, so that the wrapped publisher can
// send them in one round trip and one SQL ack covers them all. A failed call
// fails the whole message, which the relay then resends with all its events,
// in order; the wrapped publisher leaves out those Kafka already took.
type Unpacker struct {
	message.Publisher
}

// Publish unpacks msgs and publishes their events to topic.
func (u Unpacker) Publish(topic string, msgs ...*message.Message) error {
	var events []*message.Message
	for _, msg := range msgs {
		evs, err := Unpack(msg)
		if err != nil {
			return err
		}
		events = append(events, evs...)
	}
	return u.Publisher.Publish(topic, events...)
}

// rowMetadata sets the metadata column of the rows it publishes.
type rowMetadata struct {
	message.Publisher
	metadata message.Metadata
}

func (p rowMetadata) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		maps.Copy(m.Metadata, p.metadata)
	}
	return p.Publisher.Publish(topic, msgs...)
}
