package middleware

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// SeekTimeoutDefault bounds the read of the stored offsets when a consumer
// group session starts; it stays well below the group's rebalance timeout.
const SeekTimeoutDefault = 10 * time.Second

// Offsets keeps the consumer's position with its projection: each
// partition's next offset (catalog.consumer_offsets) is written by the unit
// of work in the transaction that applies the partition's records, and read
// back when a consumer group session starts, to seek every claimed partition
// there. Kafka's committed offset is only as durable as Kafka: a failover of
// the catalog database to a standby that missed its last commits, or a
// restore, would leave the group's offset past events the database no longer
// has, and those would never be applied again. The stored offset says what
// the database has, whichever database it is: behind Kafka's, the consumer
// replays what the database lost (the dedup marks and the version guard
// absorb what it kept); ahead of it (the Kafka commit had not happened yet),
// it skips what the database has. A partition with no row starts from
// Kafka's committed offset. Kafka's committed offset is still marked and
// committed, for the lag and for monitoring.
//
// A stored offset never passes a record whose effect is not committed: the
// subscriber's lanes hand a partition's records out of offset order, so
// each claimed partition registers the order it handed them in (Claim), and
// a transaction stores the end of the run, from that order's head, of
// records that are done (acked) or in the transaction itself. A record that
// went to the DLQ is done once acked; after a restore it may be dead-lettered
// again. An ack after the session ended is not done: the retry acks a
// record it yields to the partition's next owner without applying it. An
// offset row only moves forward, so that a transaction that commits late,
// or a member that lost the partition, never moves it back.
//
// The database may lose writes under a running consumer too: an
// asynchronous failover while the process keeps its consumer group session.
// The session then goes on from Kafka's position, past events the promoted
// database never got. Offset rows only move forward, so each transaction
// reads the offsets of the partitions it moves (the highest of their rows,
// as the seek does) and compares them with what this process last committed
// to them: a partition found behind that says the database lost commits. The transaction then fails with ErrOffsetsLost, and every
// claim of the process ends, so that the next session seeks to what the
// database holds.
//
// router's TestCatalog_OffsetsLiveWithTheProjection fails the catalog
// database over to a standby that missed the last transactions and sees
// every lost event applied again; TestCatalog_OffsetRowCommitsOrRollsBackWithTheProjection
// sees a failed offset write roll the projection back with it.
type Offsets struct {
	db  *sqlx.DB
	log *slog.Logger

	mu    sync.Mutex
	runs  map[claimKey]Run
	stops map[claimKey]func()
	// committed is the highest offset this process's transactions
	// committed to each partition.
	committed map[claimKey]int64
	// rewind are the partitions whose offsets the database lost, until a
	// session seeks them.
	rewind map[claimKey]bool
	// gen counts the losses found: a transaction whose offsets were worked
	// out before one may not store them.
	gen int
	// ended is the last mark of each claim that ended since the last
	// session's cleanup stored them.
	ended map[claimKey]int64
}

// Run is one claimed partition's records in the order the subscriber handed
// them to the handler.
type Run interface {
	// Next is the offset after the longest run, from the head of the records
	// handed over and not yet known as done, of records that are done or in
	// offsets (those of a transaction about to commit); ok is false when
	// nothing is known to be done.
	Next(offsets []int64) (next int64, ok bool)
}

// Position is a record's place in its topic.
type Position struct {
	Topic     string
	Partition int32
	Offset    int64
}

// PositionOf is the position of the Kafka record msg came from, false for a
// message that no subscriber delivered (a test's direct call).
func PositionOf(msg *message.Message) (Position, bool) {
	p, okP := kafka.MessagePartitionFromCtx(msg.Context())
	o, okO := kafka.MessagePartitionOffsetFromCtx(msg.Context())
	topic := message.SubscribeTopicFromCtx(msg.Context())
	return Position{Topic: topic, Partition: p, Offset: o}, okP && okO && topic != ""
}

// NewOffsets returns the offsets of the consumer whose projection lives in
// db. A nil log logs to slog.Default().
func NewOffsets(db *sqlx.DB, log *slog.Logger) *Offsets {
	return &Offsets{db: db, log: cmp.Or(log, slog.Default()), runs: map[claimKey]Run{}, stops: map[claimKey]func(){},
		committed: map[claimKey]int64{}, rewind: map[claimKey]bool{}, ended: map[claimKey]int64{}}
}

// Claim registers run as the order of topic's partition until release,
// which is given the offset after the last record the claim marked (0:
// none). The session's cleanup stores those marks: the records of a
// partition's last transactions are acked after it committed, and no later
// transaction of the claim stores their offsets, so without it a consumer
// that stops would read them again when it starts. stop ends the claim
// (and so the session): it is called when the database lost offsets.
func (o *Offsets) Claim(topic string, partition int32, run Run, stop func()) (release func(marked int64)) {
	k := claimKey{topic, partition}
	o.mu.Lock()
	o.runs[k] = run
	o.stops[k] = stop
	o.mu.Unlock()
	return func(marked int64) {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.runs[k] != run {
			return // stopped: its marks passed what the database lost
		}
		delete(o.runs, k)
		delete(o.stops, k)
		if marked > o.ended[k] {
			o.ended[k] = marked
		}
	}
}

// nexts is each partition's next offset if the records at positions commit
// now, the generation of the claims it read, and what this process had
// committed to those partitions by then; a partition nobody claims is left
// out (it is stored by whoever claims it next).
func (o *Offsets) nexts(positions []Position) ([]Position, int, map[claimKey]int64) {
	byPart := map[claimKey][]int64{}
	for _, p := range positions {
		k := claimKey{p.Topic, p.Partition}
		byPart[k] = append(byPart[k], p.Offset)
	}
	out := make([]Position, 0, len(byPart))
	had := make(map[claimKey]int64, len(byPart))
	o.mu.Lock()
	defer o.mu.Unlock()
	for k, offsets := range byPart {
		run := o.runs[k]
		if run == nil {
			continue
		}
		if next, ok := run.Next(offsets); ok {
			out = append(out, Position{Topic: k.topic, Partition: k.partition, Offset: next})
			if c, ok := o.committed[k]; ok {
				had[k] = c
			}
		}
	}
	return out, o.gen, had
}

// StoreTx writes, in tx, the next offset of each partition that the records
// at positions move on, in the rows of slot, the group commit's worker: the
// transactions of two workers, which often touch the same partitions, then
// never wait for each other's commit on a row, and the seek takes the
// highest of a partition's rows (each row alone never passes an uncommitted
// record). It goes last in the transaction (the lock order of
// handlers/boost/lock.go), rows in topic and partition order. The caller
// calls committed once tx committed. A row found behind what this process
// committed to it fails with ErrOffsetsLost, after every claim was stopped.
func (o *Offsets) StoreTx(ctx context.Context, tx *sqlx.Tx, slot int, positions []Position) (committed func(), err error) {
	if o == nil || len(positions) == 0 {
		return func() {}, nil
	}
	// What the process had committed is read before the statement runs:
	// those commits are all in the statement's snapshot, while a commit of
	// another worker noted meanwhile may not be (READ COMMITTED).
	nexts, gen, had := o.nexts(positions)
	prev, err := upsertOffsets(ctx, tx, slot, nexts)
	if err != nil {
		return nil, err
	}
	if err := o.checkNotLost(gen, had, prev); err != nil {
		return nil, err
	}
	return func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.gen != gen {
			return
		}
		for _, n := range nexts {
			k := claimKey{n.Topic, n.Partition}
			o.committed[k] = max(o.committed[k], n.Offset)
		}
	}, nil
}

// upsertOffsets moves each partition's row forward to its next offset, in
// the caller's transaction or in one of its own, and returns the
// partitions' offsets as they were before (the highest of their rows; a
// partition without a row is left out).
func upsertOffsets(ctx context.Context, tx sqlx.QueryerContext, slot int, nexts []Position) (map[claimKey]int64, error) {
	if len(nexts) == 0 {
		return nil, nil
	}
	slices.SortFunc(nexts, func(a, b Position) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	topics, parts, offsets := make([]string, len(nexts)), make([]int32, len(nexts)), make([]int64, len(nexts))
	for i, n := range nexts {
		topics[i], parts[i], offsets[i] = n.Topic, n.Partition, n.Offset
	}
	// The statements of a WITH see one snapshot: prev reads the rows as
	// they were before the upsert.
	rows, err := tx.QueryxContext(ctx, `WITH prev AS (
			SELECT o.topic, o.partition, max(o.next_offset) AS next_offset FROM catalog.consumer_offsets o
			JOIN unnest($1::text[], $2::int[]) AS r (t, p) ON o.topic = r.t AND o.partition = r.p
			GROUP BY 1, 2),
		up AS (INSERT INTO catalog.consumer_offsets AS o (topic, partition, slot, next_offset)
			SELECT t, p, $4, n FROM unnest($1::text[], $2::int[], $3::bigint[]) AS r (t, p, n) ORDER BY 1, 2
			ON CONFLICT (topic, partition, slot) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()
			WHERE o.next_offset < EXCLUDED.next_offset)
		SELECT topic, partition, next_offset FROM prev`, pq.Array(topics), pq.Array(parts), pq.Array(offsets), slot)
	if err != nil {
		return nil, fmt.Errorf("store consumer offsets: %w", err)
	}
	defer rows.Close()
	prev := map[claimKey]int64{}
	for rows.Next() {
		var k claimKey
		var next int64
		if err := rows.Scan(&k.topic, &k.partition, &next); err != nil {
			return nil, fmt.Errorf("store consumer offsets: %w", err)
		}
		prev[k] = next
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store consumer offsets: %w", err)
	}
	return prev, nil
}

// Stored is the next offset of each partition of topic that has rows: the
// highest of them.
func (o *Offsets) Stored(ctx context.Context, topic string, partitions []int32) (map[int32]int64, error) {
	var rows []struct {
		Partition int32 `db:"partition"`
		Next      int64 `db:"next_offset"`
	}
	if err := o.db.SelectContext(ctx, &rows, `SELECT partition, max(next_offset) AS next_offset
		FROM catalog.consumer_offsets WHERE topic = $1 AND partition = ANY($2::int[]) GROUP BY partition`,
		topic, pq.Array(partitions)); err != nil {
		return nil, fmt.Errorf("read consumer offsets of %s: %w", topic, err)
	}
	out := make(map[int32]int64, len(rows))
	for _, r := range rows {
		out[r.Partition] = r.Next
	}
	return out, nil
}

// cleanupSlot holds the marks a session's cleanup stores, apart from the
// group commit's workers.
const cleanupSlot = -1

// Seeker wraps a consumer group handler so that each session starts every
// claimed partition at its stored offset. A session whose offsets cannot be
// read fails its setup, and the subscriber joins again: starting from
// Kafka's offset instead could skip what the database lost.
func (o *Offsets) Seeker(h sarama.ConsumerGroupHandler) sarama.ConsumerGroupHandler {
	return seeker{ConsumerGroupHandler: h, offsets: o}
}

type seeker struct {
	sarama.ConsumerGroupHandler
	offsets *Offsets
}

// Cleanup stores the last marks of the session's claims, which are all
// ended by now, before the next session reads them. A failure is logged:
// the consumer then reads those records again, as duplicates.
func (s seeker) Cleanup(sess sarama.ConsumerGroupSession) error {
	s.offsets.mu.Lock()
	marks := make([]Position, 0, len(s.offsets.ended))
	for k, next := range s.offsets.ended {
		marks = append(marks, Position{Topic: k.topic, Partition: k.partition, Offset: next})
	}
	clear(s.offsets.ended)
	s.offsets.mu.Unlock()
	if len(marks) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), SeekTimeoutDefault)
		defer cancel()
		if _, err := upsertOffsets(ctx, s.offsets.db, cleanupSlot, marks); err != nil {
			s.offsets.log.Warn("consumer-offsets-not-stored", "partitions", len(marks), "error", err.Error())
		}
	}
	return s.ConsumerGroupHandler.Cleanup(sess)
}

func (s seeker) Setup(sess sarama.ConsumerGroupSession) error {
	ctx, cancel := context.WithTimeout(sess.Context(), SeekTimeoutDefault)
	defer cancel()
	for topic, partitions := range sess.Claims() {
		stored, err := s.offsets.Stored(ctx, topic, partitions)
		if err != nil {
			s.offsets.log.Error("consumer-offsets-unreadable", "topic", topic, "error", err.Error())
			return err
		}
		var oldest []int32
		for _, p := range partitions {
			rewind := s.offsets.rewound(topic, p)
			next, ok := stored[p]
			switch {
			case ok:
				// Sarama moves a partition's offset back only by ResetOffset
				// and forward only by MarkOffset: one of the two takes.
				sess.ResetOffset(topic, p, next, "")
				sess.MarkOffset(topic, p, next, "")
			case rewind:
				// The database lost every row of a partition this process
				// had stored: Kafka's offset is past what it lost. The
				// subscriber's initial offset is the oldest.
				sess.ResetOffset(topic, p, sarama.OffsetOldest, "")
				oldest = append(oldest, p)
			}
		}
		level := slog.LevelInfo
		if len(stored) == 0 && len(oldest) == 0 {
			level = slog.LevelDebug // nothing sought: Kafka's offsets hold
		}
		s.offsets.log.Log(sess.Context(), level, "consumer-offsets-seek", "topic", topic, "claimed", len(partitions),
			"stored", stored, "oldest", oldest)
	}
	go s.offsets.watch(sess.Context(), LossCheckInterval)
	return s.ConsumerGroupHandler.Setup(sess)
}
