package dlqreplay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/middleware"
)

// The ledger (catalog.dlq_replays) makes a replay once per original, across
// runs and consumer groups. A group's committed offsets only say how far
// that group read: a run in a new group read the whole DLQ again, and the
// copies that replayed records had left in it by dying again, so three
// rounds in three groups turned 1 dead letter into 40 replays. Every copy
// of a dead letter carries its first origin (middleware.PoisonQueue keeps
// it on a replayed record), so one row per origin covers them all.
//
// A run writes the row only after the replay topic acknowledged the record
// (replayOnce): a crash between the two loses nothing, and at worst replays
// that one record again in the next run, which the consumer's dedup (its
// MessageId) absorbs.

// origin is where a dead letter's record first failed.
type origin struct {
	Topic     string
	Partition int32
	Offset    int64
}

// originOf is msg's first origin from its headers. A dead letter without
// them (one that did not come from the consumer) is its own origin: its
// place in the DLQ.
func originOf(rec *sarama.ConsumerMessage, msg *message.Message) origin {
	topic := msg.Metadata.Get(middleware.HeaderSourceTopic)
	p, perr := strconv.ParseInt(msg.Metadata.Get(middleware.HeaderOriginalPartition), 10, 32)
	o, oerr := strconv.ParseInt(msg.Metadata.Get(middleware.HeaderOriginalOffset), 10, 64)
	if topic == "" || errors.Join(perr, oerr) != nil || p < 0 || o < 0 {
		return origin{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset}
	}
	return origin{Topic: topic, Partition: int32(p), Offset: o}
}

// replayed reports whether an earlier run replayed o.
func replayed(ctx context.Context, q sqlx.QueryerContext, o origin) (bool, error) {
	var ok bool
	err := sqlx.GetContext(ctx, q, &ok, `SELECT EXISTS (SELECT FROM catalog.dlq_replays
		WHERE source_topic = $1 AND source_partition = $2 AND source_offset = $3)`, o.Topic, o.Partition, o.Offset)
	if err != nil {
		return false, fmt.Errorf("read the replay ledger for %s/%d@%d: %w", o.Topic, o.Partition, o.Offset, err)
	}
	return ok, nil
}

// errReplayedMeanwhile is an origin that another run, in another group,
// replayed while this one was deciding.
var errReplayedMeanwhile = errors.New("replayed by another run meanwhile")

// replayOnce publishes o's record and records it, in one transaction that
// holds o's advisory lock (a transaction lock, which PgBouncer's
// transaction pooling keeps), so that two runs at once in different groups
// publish each origin once: without Force, the second finds the first's
// row under the lock (errReplayedMeanwhile). A crash after the publish and
// before the commit records nothing: the next run publishes the record
// again, and the consumer's dedup applies it once.
func (c Config) replayOnce(ctx context.Context, o origin, publish func() error) error {
	tx, err := c.DB.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin the replay ledger's transaction: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // after Commit, a no-op
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`,
		fmt.Sprintf("promoflow-dlq-replay:%s/%d@%d", o.Topic, o.Partition, o.Offset)); err != nil {
		return fmt.Errorf("lock %s/%d@%d in the replay ledger: %w", o.Topic, o.Partition, o.Offset, err)
	}
	if !c.Force {
		if done, err := replayed(ctx, tx, o); err != nil || done {
			return cmp.Or(err, errReplayedMeanwhile)
		}
	}
	if err := publish(); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO catalog.dlq_replays (source_topic, source_partition, source_offset, last_group)
		VALUES ($1, $2, $3, $4)
		ON CONFLICT (source_topic, source_partition, source_offset) DO UPDATE
		SET replays = dlq_replays.replays + 1, last_replayed_at = now(), last_group = EXCLUDED.last_group`,
		o.Topic, o.Partition, o.Offset, c.Group)
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		return fmt.Errorf("record the replay of %s/%d@%d in the ledger: %w", o.Topic, o.Partition, o.Offset, err)
	}
	return nil
}

// ErrNoLedger is a replay run without the catalog's database.
var ErrNoLedger = errors.New("dlq-replay needs the catalog database (--database-url or $DATABASE_URL): " +
	"it records there each original it replayed, so that no later run replays it again")

// checkLedger turns a replay verdict into done when an earlier run replayed
// the dead letter's original and Force is off.
func (c Config) checkLedger(ctx context.Context, rec *sarama.ConsumerMessage, msg *message.Message, v verdict) (verdict, error) {
	if v != replay || c.Force {
		return v, nil
	}
	if ok, err := replayed(ctx, c.DB, originOf(rec, msg)); err != nil || !ok {
		return v, err
	}
	return done, nil
}
