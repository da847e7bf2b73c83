package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
)

// Merging limits: the relay merges consecutive rows of fewer than
// MergeRowsBelow events each, starting a new message where MaxEventsPerRelay
// events came before, so a merged message holds fewer than
// MaxEventsPerRelay + MergeRowsBelow events. A larger row (an expirer batch)
// is already worth a Kafka request of its own and goes alone, as written:
// merging it would only re-encode it.
const (
	MaxEventsPerRelay = 500
	MergeRowsBelow    = 50
)

// RelaySchema is the relay's schema adapter: it reads a page of up to
// pageRows outbox rows in commit order, as watermill-sql's PostgreSQL schema
// does, and merges each run of small rows into one message, so that the
// relay sends them in one Kafka request. Transactions of one event (the
// purchase API's) are relayed nearly as fast as the expirer's batches. The
// page is still acked once, after its last message, which carries
// PageEndMetadataKey (PageTransaction).
//
// It reads below the relay's horizon (promotion.outbox_relay_horizon): only
// a running outbox writer (BeginTx) holds the relay back, not every
// transaction of the server as watermill-sql's snapshot xmin does.
//
// A poll that takes the position from a holder whose transaction did not
// commit waits takeoverWait before it reads (promotion.outbox_relay_position),
// so that whatever that holder may still send within its lease
// (PositionGuard) reaches Kafka first.
//
// A position transaction that stays idle longer than idleTimeout (0: no
// limit) loses its session, and so the position: a process frozen with its
// connection up (SIGSTOP, a stalled VM) cannot hold it for ever
// (PositionGuardConfig.IdleTimeout).
//
// While back says the relay stands back (StepBack.Back; nil: never), it
// selects nothing, so a poll takes no lock on the position.
func RelaySchema(pageRows int, back func() bool, takeoverWait, idleTimeout time.Duration) wmsql.SchemaAdapter {
	return relaySchema{Schema(max(pageRows, 1)), back, takeoverWait, idleTimeout}
}

type relaySchema struct {
	wmsql.DefaultPostgreSQLSchema
	back         func() bool
	takeoverWait time.Duration
	idleTimeout  time.Duration
}

// standingBackSQL reads no row and locks nothing.
const standingBackSQL = `SELECT NULL WHERE false`

// SelectQuery reads the page as the default query does (the offsets row
// locked FOR UPDATE, in commit order), but below the relay's horizon instead
// of the snapshot's xmin, with the position as one row comparison, so that
// PostgreSQL walks the primary key in order and stops after the page instead
// of reading the whole backlog to sort it, and groups it with mergeSQL. The
// horizon is a subquery, so that it is computed once per read. While the
// relay stands back it reads nothing (standingBackSQL).
func (s relaySchema) SelectQuery(topic, consumerGroup string, _ wmsql.OffsetsAdapter) wmsql.Query {
	if s.back != nil && s.back() {
		return wmsql.Query{Query: standingBackSQL}
	}
	page := fmt.Sprintf(`WITH last_processed AS (SELECT * FROM promotion.outbox_relay_position($1, $2, $3))
		SELECT "offset", transaction_id, uuid, payload, metadata FROM %s
		WHERE (transaction_id, "offset") > ((SELECT last_processed_transaction_id FROM last_processed),
				(SELECT offset_acked FROM last_processed))
			AND transaction_id < (SELECT promotion.outbox_relay_horizon(pg_current_snapshot()))
		ORDER BY transaction_id, "offset" LIMIT %d`,
		s.MessagesTable(topic), s.SubscribeBatchSize)
	return wmsql.Query{Query: fmt.Sprintf(mergeSQL, page, MaxEventsPerRelay, MergeRowsBelow),
		Args: []any{consumerGroup, s.takeoverWait.Seconds(), s.idleTimeout.Seconds()}}
}

// mergeSQL groups a page of outbox rows (%[1]s) in commit order:
//
//   - A row of %[3]d events or more is a group of its own, and so is a row
//     whose destination topic does not lead its envelope (forwarder's
//     layout, read without parsing the whole payload).
//   - Consecutive smaller rows to one destination topic form a run; a run
//     is cut into groups where %[2]d events came before in it.
//
// It returns a row per group in the default layout: the last row's offset,
// transaction id and uuid (the ack's position); a group of one row is that
// row, and a group of several has the JSON array of their payloads (forwarder
// envelopes) and, in its metadata, mergedRowsKey, the rows' offsets in order
// (mergedOffsetsKey) and their destination topic (mergedDestinationKey),
// which UnmarshalMessage merges. The page's last group carries
// PageEndMetadataKey in its metadata (PageTransaction).
const mergeSQL = `WITH page AS (
%[1]s
), marked AS (
	SELECT p.*, substring(p.payload::text FROM '^\{"destination_topic":"([^"\\]*)"') AS dest,
		coalesce((p.metadata->>'` + EventsMetadataKey + `')::bigint, 1) AS n,
		row_number() OVER (ORDER BY p.transaction_id, p."offset") AS rn
	FROM page p
), runs AS (
	SELECT m.*,
		CASE WHEN m.n >= %[3]d OR m.dest IS NULL THEN -m.rn
			ELSE count(*) FILTER (WHERE m.n >= %[3]d OR m.dest IS NULL) OVER w END AS run,
		sum(CASE WHEN m.dest IS DISTINCT FROM m.prev THEN 1 ELSE 0 END) OVER w AS seg
	FROM (SELECT marked.*, lag(dest) OVER (ORDER BY rn) AS prev FROM marked) m
	WINDOW w AS (ORDER BY m.rn)
), grouped AS (
	SELECT r.*, ((sum(n) OVER (PARTITION BY seg, run ORDER BY rn) - n)::bigint / %[2]d) AS chunk
	FROM runs r
), groups AS (
	SELECT seg, run, chunk, max(rn) AS last_rn, count(*) AS rows FROM grouped GROUP BY seg, run, chunk
), merged AS (
	SELECT g.last_rn, json_agg(x.payload ORDER BY x.rn) AS payloads,
		string_agg(x."offset"::text, ',' ORDER BY x.rn) AS offsets
	FROM groups g JOIN grouped x USING (seg, run, chunk)
	WHERE g.rows > 1
	GROUP BY g.last_rn
)
SELECT "offset", transaction_id, uuid, payload,
	CASE WHEN last_rn < max(last_rn) OVER () OR json_typeof(metadata) IS DISTINCT FROM 'object' THEN metadata
		ELSE (metadata::jsonb || '{"` + PageEndMetadataKey + `":"1"}')::json END AS metadata
FROM (
	SELECT l."offset", l.transaction_id, l.uuid, g.last_rn,
		CASE WHEN g.rows = 1 THEN l.payload ELSE m.payloads END AS payload,
		CASE WHEN g.rows = 1 THEN l.metadata ELSE json_build_object('` + mergedRowsKey + `', g.rows::text,
			'` + mergedOffsetsKey + `', m.offsets, '` + mergedDestinationKey + `', l.dest) END AS metadata
	FROM groups g JOIN grouped l ON l.rn = g.last_rn LEFT JOIN merged m ON m.last_rn = g.last_rn
) grouped_rows
ORDER BY last_rn`

// Metadata of a row of mergeSQL that holds several rows' envelopes: how many,
// their offsets and their destination topic.
const (
	mergedRowsKey        = "outbox_merged_rows"
	mergedOffsetsKey     = "outbox_merged_offsets"
	mergedDestinationKey = "outbox_destination"
)

// envelope is a forwarder envelope, in watermill's layout.
type envelope struct {
	DestinationTopic string           `json:"destination_topic"`
	UUID             string           `json:"uuid"`
	Payload          []byte           `json:"payload"`
	Metadata         message.Metadata `json:"metadata"`
}

// UnmarshalMessage reads a row as the default schema does and merges the
// envelopes of a group into one envelope whose payload is a batch of all
// their events, in order (pack's layout). A row of one event written before
// batches becomes one element. The message it returns carries the outbox
// offset (OffsetMetadataKey) of its row, or, for a group, of its last row.
//
// A group with a row that cannot be read does not fail the relay's read
// (which would stop the relay with no word of the row): its envelope says
// so instead, and carries that row's offset, and Unpack refuses it with
// ErrUnreadable, so that the relay reports the row and stops there.
func (s relaySchema) UnmarshalMessage(row wmsql.Scanner) (wmsql.Row, error) {
	r, err := s.DefaultPostgreSQLSchema.UnmarshalMessage(row)
	if err != nil {
		return r, err
	}
	meta := r.Msg.Metadata
	pageEnd := meta.Get(PageEndMetadataKey)
	if meta.Get(mergedRowsKey) == "" {
		meta.Set(OffsetMetadataKey, strconv.FormatInt(r.Offset, 10))
		return r, nil
	}
	offset := strconv.FormatInt(r.Offset, 10)
	env := envelope{DestinationTopic: meta.Get(mergedDestinationKey), UUID: string(r.UUID)}
	m, err := merge(r.Payload, strings.Split(meta.Get(mergedOffsetsKey), ","))
	var bad *unreadableRow
	switch {
	case errors.As(err, &bad):
		offset = bad.offset
		env.Metadata = message.Metadata{unreadableKey: bad.Error()}
	case err != nil:
		return wmsql.Row{}, err
	default:
		env.UUID, env.Payload = m.lastUUID, m.batch
		env.Metadata = message.Metadata{EventsMetadataKey: strconv.Itoa(m.events)}
	}
	r.Payload, err = json.Marshal(env)
	if err != nil {
		return wmsql.Row{}, fmt.Errorf("merge outbox rows up to %d: %w", r.Offset, err)
	}
	r.Msg = message.NewMessage(string(r.UUID), r.Payload)
	r.Msg.Metadata = maps.Clone(env.Metadata)
	r.Msg.Metadata.Set(OffsetMetadataKey, offset)
	if pageEnd != "" {
		r.Msg.Metadata.Set(PageEndMetadataKey, pageEnd)
	}
	return r, nil
}

// unreadableRow is a row of a group that merge cannot read.
type unreadableRow struct {
	offset string
	err    error
}

func (e *unreadableRow) Error() string { return fmt.Sprintf("outbox row %s: %v", e.offset, e.err) }

// mergedRows is a group's events as one batch payload.
type mergedRows struct {
	batch    []byte
	events   int
	lastUUID string // the last envelope's
}

// merge joins the events of a group's envelopes (payloads, a JSON array of
// them, one per offset) into one batch payload in the framed layout: a framed
// row's frames as they are, the events of a framed row with shared trace
// headers, of a row of the JSON layout or of one event written before
// batches as new frames. A row it cannot read is an *unreadableRow.
func merge(payloads []byte, offsets []string) (mergedRows, error) {
	var rows []json.RawMessage
	if err := json.Unmarshal(payloads, &rows); err != nil {
		return mergedRows{}, fmt.Errorf("merge outbox rows %s: %w", strings.Join(offsets, ","), err)
	}
	if len(rows) != len(offsets) {
		return mergedRows{}, fmt.Errorf("merge outbox rows %s: %d rows", strings.Join(offsets, ","), len(rows))
	}
	m := mergedRows{batch: slices.Clone(framesMagic)}
	for i, raw := range rows {
		var env envelope
		if err := json.Unmarshal(raw, &env); err != nil {
			return mergedRows{}, &unreadableRow{offsets[i], err}
		}
		m.lastUUID = env.UUID
		n, err := m.add(env)
		if err != nil {
			return mergedRows{}, &unreadableRow{offsets[i], err}
		}
		m.events += n
	}
	return m, nil
}

// add appends the events of one row's envelope to the batch and returns how
// many.
func (m *mergedRows) add(env envelope) (int, error) {
	if env.Metadata.Get(EventsMetadataKey) == "" {
		m.batch = appendFrame(m.batch, &message.Message{UUID: env.UUID, Payload: env.Payload, Metadata: env.Metadata}, nil)
		return 1, nil
	}
	want, err := strconv.Atoi(env.Metadata.Get(EventsMetadataKey))
	if err != nil {
		return 0, fmt.Errorf("events announced: %w", err)
	}
	var n int
	switch shared := sharedOf(env.Metadata); {
	case isFramed(env.Payload) && shared == nil:
		frames := env.Payload[len(framesMagic):]
		if n, err = countFrames(frames); err != nil {
			return 0, err
		}
		m.batch = append(m.batch, frames...)
	case isFramed(env.Payload):
		// The merged batch's other rows do not share these trace headers:
		// each of this row's events gets them back in its frame.
		if n, err = walkFrames(env.Payload[len(framesMagic):], shared, func(e *message.Message) {
			m.batch = appendFrame(m.batch, e, nil)
		}); err != nil {
			return 0, err
		}
	default:
		var evs []packedEvent
		if err := json.Unmarshal(env.Payload, &evs); err != nil {
			return 0, err
		}
		for _, e := range evs {
			m.batch = appendFrame(m.batch, &message.Message{UUID: e.UUID, Payload: e.Payload, Metadata: e.Metadata}, nil)
		}
		n = len(evs)
	}
	if n != want {
		return 0, fmt.Errorf("%d events, %d announced", n, want)
	}
	return n, nil
}
