package outbox

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
)

// framesMagic leads a batch payload in the framed layout: after it, one frame
// per event, in order. A frame is the event's UUID, its payload and its
// metadata, each length-prefixed (unsigned varints):
//
//	len uuid | len payload | pairs | (len key | key | len value | value)...
//
// with the bytes of each field after its length. A trace header that every
// event of a batch carries with one value (an expirer batch's events share
// their writer's span) is left out of the frames and written once, in the
// batch's metadata (sharedKeyPrefix); Unpack gives it back to each event.
// Frames concatenate, so the relay merges the batches of several rows
// without decoding their events, and reading one is a walk over lengths: the
// JSON array of packedEvent that batches were first written in cost the
// relay about half its CPU in a burst (a JSON scan and a base64 decode of
// every payload, inside the forwarder's envelope, which base64-encodes the
// batch again). Unpack reads both layouts.
var framesMagic = []byte("\x00pfb1")

// errFrames is a framed batch that does not parse.
var errFrames = errors.New("malformed framed batch")

// appendFrame appends msg's frame to dst, without the pairs of shared (which
// msg has: the batch's shared trace headers). Metadata pairs go in key order,
// so that a batch's bytes follow from its events.
func appendFrame(dst []byte, msg *message.Message, shared message.Metadata) []byte {
	dst = appendField(dst, msg.UUID)
	dst = binary.AppendUvarint(dst, uint64(len(msg.Payload)))
	dst = append(dst, msg.Payload...)
	keys := make([]string, 0, len(msg.Metadata))
	for k := range msg.Metadata {
		if _, ok := shared[k]; !ok {
			keys = append(keys, k)
		}
	}
	dst = binary.AppendUvarint(dst, uint64(len(keys)))
	slices.Sort(keys)
	for _, k := range keys {
		dst = appendField(dst, k)
		dst = appendField(dst, msg.Metadata[k])
	}
	return dst
}

func appendField(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// isFramed reports whether payload is a batch in the framed layout.
func isFramed(payload []byte) bool { return bytes.HasPrefix(payload, framesMagic) }

// decodeFrames returns the events of a framed batch, in order, each with the
// pairs of shared besides its own; their payloads share batch's memory. It
// fails unless batch holds exactly want whole frames.
func decodeFrames(batch []byte, want int, shared message.Metadata) ([]*message.Message, error) {
	out := make([]*message.Message, 0, want)
	n, err := walkFrames(batch[len(framesMagic):], shared, func(msg *message.Message) { out = append(out, msg) })
	if err != nil {
		return nil, err
	}
	if n != want {
		return nil, fmt.Errorf("%w: %d events, %d announced", errFrames, n, want)
	}
	return out, nil
}

// countFrames checks that frames (a framed batch without its magic) parses and
// returns how many events it holds, without building them.
func countFrames(frames []byte) (int, error) { return walkFrames(frames, nil, nil) }

// walkFrames reads frames (a framed batch without its magic) to its end and
// returns how many events it holds; each is handed to keep, with the pairs
// of shared besides its own, or, when keep is nil, only checked and not built.
func walkFrames(frames []byte, shared message.Metadata, keep func(*message.Message)) (int, error) {
	r := frameReader{rest: frames, shared: shared}
	n := 0
	for len(r.rest) > 0 {
		msg, err := r.frame(keep != nil)
		if err != nil {
			return 0, fmt.Errorf("%w: event %d: %w", errFrames, n, err)
		}
		if keep != nil {
			keep(msg)
		}
		n++
	}
	return n, nil
}

type frameReader struct {
	rest []byte
	// shared are the pairs every event built gets besides its own.
	shared message.Metadata
}

// frame reads the next frame; it builds the event only when build is set.
// The event's UUID and its metadata's keys and values are substrings of one
// string: one allocation a frame rather than one a field (an event of the
// expirer has 15 and more fields).
func (r *frameReader) frame(build bool) (*message.Message, error) {
	id, err := r.field()
	if err != nil {
		return nil, fmt.Errorf("uuid: %w", err)
	}
	payload, err := r.field()
	if err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	pairs, err := r.length()
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	// Each pair takes two bytes at least: a bound before the map is sized.
	if pairs > uint64(len(r.rest))/2 {
		return nil, fmt.Errorf("metadata: %d pairs in %d bytes", pairs, len(r.rest))
	}
	metaAt := r.rest
	for range pairs {
		k, err := r.field()
		if err != nil {
			return nil, fmt.Errorf("metadata key: %w", err)
		}
		if _, err := r.field(); err != nil {
			return nil, fmt.Errorf("metadata value of %q: %w", k, err)
		}
	}
	if !build {
		return nil, nil
	}
	meta := metaAt[:len(metaAt)-len(r.rest)]
	var text strings.Builder
	text.Grow(len(id) + len(meta))
	text.Write(id)
	text.Write(meta)
	all := text.String()
	msg := message.NewMessage(all[:len(id)], payload)
	msg.Metadata = make(message.Metadata, int(pairs)+len(r.shared))
	maps.Copy(msg.Metadata, r.shared)
	// The pairs parsed above: a second walk over them cannot fail.
	m := frameReader{rest: meta}
	substring := func() string {
		f, _ := m.field()
		end := len(id) + len(meta) - len(m.rest)
		return all[end-len(f) : end]
	}
	for range pairs {
		k := substring()
		msg.Metadata[k] = substring()
	}
	return msg, nil
}

func (r *frameReader) length() (uint64, error) {
	n, size := binary.Uvarint(r.rest)
	if size <= 0 {
		return 0, errors.New("bad length")
	}
	r.rest = r.rest[size:]
	return n, nil
}

func (r *frameReader) field() ([]byte, error) {
	n, err := r.length()
	if err != nil {
		return nil, err
	}
	if n > uint64(len(r.rest)) {
		return nil, fmt.Errorf("%d bytes announced, %d left", n, len(r.rest))
	}
	f := r.rest[:n:n]
	r.rest = r.rest[n:]
	return f, nil
}
