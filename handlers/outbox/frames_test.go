package outbox

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
)

func events(n int) []*message.Message {
	out := make([]*message.Message, n)
	for i := range out {
		out[i] = message.NewMessage(fmt.Sprintf("ev-%d", i), fmt.Appendf(nil, `{"PurchaseId":"p-%d","Note":"a \"quoted\" é"}`, i))
		out[i].Metadata.Set("aggregate_id", fmt.Sprintf("p-%d", i))
		out[i].Metadata.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		out[i].Metadata.Set("empty", "")
	}
	return out
}

func requireSameEvents(t *testing.T, want, got []*message.Message) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		require.Equal(t, want[i].UUID, got[i].UUID, "event %d", i)
		require.Equal(t, want[i].Payload, got[i].Payload, "event %d", i)
		require.Equal(t, want[i].Metadata, got[i].Metadata, "event %d", i)
	}
}

func TestPack_FramedBatchUnpacksToItsEventsInOrder(t *testing.T) {
	want := events(7)
	batch := pack(want)
	require.True(t, isFramed(batch.Payload))
	got, err := Unpack(batch)
	require.NoError(t, err)
	requireSameEvents(t, want, got)
	require.Equal(t, pack(want).Payload, batch.Payload, "a batch's bytes follow from its events")
}

// A trace header that every event of a batch carries with one value is
// written once, in the batch's metadata, and each event gets it back; one
// that the events do not all share stays in every frame.
func TestPack_TraceHeadersEveryEventSharesAreWrittenOnce(t *testing.T) {
	want := events(5)
	for _, e := range want {
		e.Metadata.Set("tracestate", "k=v")
	}
	want[3].Metadata.Set("tracestate", "k=other")
	batch := pack(want)
	traceparent := want[0].Metadata.Get("traceparent")
	require.Equal(t, traceparent, batch.Metadata.Get(sharedKeyPrefix+"traceparent"))
	require.NotContains(t, string(batch.Payload), traceparent, "the shared traceparent is in no frame")
	require.NotContains(t, batch.Metadata, sharedKeyPrefix+"tracestate", "event 3's tracestate differs")
	require.Equal(t, 4, strings.Count(string(batch.Payload), "k=v"), "every frame keeps its own tracestate")
	got, err := Unpack(batch)
	require.NoError(t, err)
	requireSameEvents(t, want, got)

	one := pack(want[:1])
	require.Contains(t, string(one.Payload), traceparent, "a batch of one event shares nothing")
	require.NotContains(t, one.Metadata, sharedKeyPrefix+"traceparent")
}

// jsonLayout is a batch as a release before the framed layout wrote it.
func jsonLayout(msgs []*message.Message) *message.Message {
	payload := []byte("[")
	for i, m := range msgs {
		meta, _ := json.Marshal(m.Metadata)
		if i > 0 {
			payload = append(payload, ',')
		}
		payload = fmt.Appendf(payload, `{"uuid":%q,"payload":%q,"metadata":%s}`,
			m.UUID, base64.StdEncoding.EncodeToString(m.Payload), meta)
	}
	batch := message.NewMessage("batch-json", append(payload, ']'))
	batch.Metadata.Set(EventsMetadataKey, strconv.Itoa(len(msgs)))
	return batch
}

func TestUnpack_ReadsBatchesOfTheJSONLayout(t *testing.T) {
	want := events(3)
	got, err := Unpack(jsonLayout(want))
	require.NoError(t, err)
	requireSameEvents(t, want, got)
}

func TestUnpack_RefusesAFramedBatchThatDoesNotParse(t *testing.T) {
	good := pack(events(3))
	for name, mutate := range map[string]func(m *message.Message){
		"truncated":       func(m *message.Message) { m.Payload = m.Payload[:len(m.Payload)-5] },
		"trailing bytes":  func(m *message.Message) { m.Payload = append(m.Payload, 0x09) },
		"more announced":  func(m *message.Message) { m.Metadata.Set(EventsMetadataKey, "4") },
		"fewer announced": func(m *message.Message) { m.Metadata.Set(EventsMetadataKey, "2") },
		"huge length": func(m *message.Message) {
			m.Payload = append(append([]byte{}, framesMagic...), 0xff, 0xff, 0xff, 0xff, 0x0f)
			m.Metadata.Set(EventsMetadataKey, "1")
		},
	} {
		t.Run(name, func(t *testing.T) {
			bad := message.NewMessage(good.UUID, append([]byte{}, good.Payload...))
			bad.Metadata = message.Metadata{EventsMetadataKey: good.Metadata.Get(EventsMetadataKey)}
			mutate(bad)
			_, err := Unpack(bad)
			require.ErrorIs(t, err, ErrUnreadable)
			require.ErrorContains(t, err, good.UUID, "the error names the batch")
		})
	}
}

func envelopeJSON(t *testing.T, msg *message.Message) json.RawMessage {
	t.Helper()
	raw, err := json.Marshal(envelope{DestinationTopic: "dest", UUID: msg.UUID, Payload: msg.Payload, Metadata: msg.Metadata})
	require.NoError(t, err)
	return raw
}

// merge joins rows of each layout an outbox may hold, in order: a framed
// batch, a batch of the JSON layout and one event written before batches.
func TestMerge_JoinsRowsOfEveryLayoutInOrder(t *testing.T) {
	all := events(6)
	rows := []json.RawMessage{envelopeJSON(t, pack(all[:2])), envelopeJSON(t, jsonLayout(all[2:5])), envelopeJSON(t, all[5])}
	payloads, err := json.Marshal(rows)
	require.NoError(t, err)

	m, err := merge(payloads, []string{"1", "2", "3"})
	require.NoError(t, err)
	require.Equal(t, 6, m.events)
	require.Equal(t, all[5].UUID, m.lastUUID)
	batch := message.NewMessage("merged", m.batch)
	batch.Metadata.Set(EventsMetadataKey, strconv.Itoa(m.events))
	got, err := Unpack(batch)
	require.NoError(t, err)
	requireSameEvents(t, all, got)
}

// merge gives each event of a row whose events shared their trace headers
// those headers back, in its own frame: the merged batch's rows come from
// transactions of different traces.
func TestMerge_KeepsEachRowsSharedTraceOnItsOwnEvents(t *testing.T) {
	all := events(6)
	for i, e := range all {
		e.Metadata.Set("traceparent", fmt.Sprintf("00-%032x-%016x-01", 1+i/3, 1+i/3))
	}
	rows := []json.RawMessage{envelopeJSON(t, pack(all[:3])), envelopeJSON(t, pack(all[3:]))}
	payloads, err := json.Marshal(rows)
	require.NoError(t, err)

	m, err := merge(payloads, []string{"1", "2"})
	require.NoError(t, err)
	batch := message.NewMessage("merged", m.batch)
	batch.Metadata.Set(EventsMetadataKey, strconv.Itoa(m.events))
	got, err := Unpack(batch)
	require.NoError(t, err)
	requireSameEvents(t, all, got)
}

func TestMerge_NamesTheRowItCannotRead(t *testing.T) {
	bad := pack(events(2))
	bad.Payload = bad.Payload[:len(bad.Payload)-1]
	for name, row := range map[string]*message.Message{"framed": bad, "announced": pack(events(1))} {
		t.Run(name, func(t *testing.T) {
			if name == "announced" {
				row.Metadata.Set(EventsMetadataKey, "3")
			}
			payloads, err := json.Marshal([]json.RawMessage{envelopeJSON(t, pack(events(1))), envelopeJSON(t, row)})
			require.NoError(t, err)
			_, err = merge(payloads, []string{"10", "11"})
			var unreadable *unreadableRow
			require.True(t, errors.As(err, &unreadable), "%v", err)
			require.Equal(t, "11", unreadable.offset)
		})
	}
}

// FuzzDecodeFrames: any bytes either decode to events that pack back to the
// same bytes, or fail with errFrames; none panics.
func FuzzDecodeFrames(f *testing.F) {
	f.Add([]byte(pack(events(2)).Payload[len(framesMagic):]))
	f.Add([]byte{})
	f.Add([]byte{0x01, 'a', 0x00, 0x00})
	f.Add([]byte{0x01, 'a', 0x00, 0x05, 0x00})
	f.Fuzz(func(t *testing.T, frames []byte) {
		n, countErr := countFrames(frames)
		batch := append(append([]byte{}, framesMagic...), frames...)
		got, err := decodeFrames(batch, n, nil)
		if countErr != nil {
			require.ErrorIs(t, countErr, errFrames)
			_, err := decodeFrames(batch, 0, nil)
			require.ErrorIs(t, err, errFrames)
			return
		}
		require.NoError(t, err)
		require.Len(t, got, n)
		// Metadata keys may repeat in the input; the events keep the last
		// value, and pack writes each key once, in order.
		again, err := Unpack(pack(got))
		require.NoError(t, err)
		requireSameEvents(t, got, again)
	})
}
