package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// TopicPinsTable records, per topic, the partition count the relay hashes
// its keys over (sqlmigrate 0014_relay_topic_partitions.sql).
const TopicPinsTable = "promotion.relay_topic_partitions"

// PinPartitions records partitions as topic's pinned partition count unless
// one is recorded already, and returns the recorded count: the first count
// any relay saw stays, whoever sees the topic next.
func PinPartitions(ctx context.Context, db sqlx.QueryerContext, topic string, partitions int32) (int32, error) {
	// Read first: a pin recorded already needs no write, so that a relay on
	// a server that refuses writes still knows it.
	pinned, ok, err := PinnedPartitions(ctx, db, topic)
	if err != nil || ok {
		return pinned, err
	}
	// The CTE's SELECT does not see the row its INSERT adds: one of the two
	// answers, never both.
	err = sqlx.GetContext(ctx, db, &pinned, `WITH added AS (
			INSERT INTO `+TopicPinsTable+` (topic, partitions) VALUES ($1, $2)
			ON CONFLICT (topic) DO NOTHING RETURNING partitions)
		SELECT partitions FROM added
		UNION ALL SELECT partitions FROM `+TopicPinsTable+` WHERE topic = $1
		LIMIT 1`, topic, partitions)
	if err != nil {
		return 0, fmt.Errorf("pin the partitions of topic %s: %w", topic, err)
	}
	return pinned, nil
}

// PinnedPartitions is topic's pinned partition count; ok is false when none
// is recorded.
func PinnedPartitions(ctx context.Context, db sqlx.QueryerContext, topic string) (pinned int32, ok bool, err error) {
	err = sqlx.GetContext(ctx, db, &pinned, `SELECT partitions FROM `+TopicPinsTable+` WHERE topic = $1`, topic)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read the pinned partitions of topic %s: %w", topic, err)
	}
	return pinned, true, nil
}

// Pins are the pinned partition counts of every topic, by topic.
func Pins(ctx context.Context, db sqlx.QueryerContext) (map[string]int32, error) {
	var rows []struct {
		Topic      string `db:"topic"`
		Partitions int32  `db:"partitions"`
	}
	if err := sqlx.SelectContext(ctx, db, &rows, `SELECT topic, partitions FROM `+TopicPinsTable); err != nil {
		return nil, fmt.Errorf("read the pinned partitions: %w", err)
	}
	out := make(map[string]int32, len(rows))
	for _, r := range rows {
		out[r.Topic] = r.Partitions
	}
	return out, nil
}
