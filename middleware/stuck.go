package middleware

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
)

// Stuck tracks, per partition, the record the retry keeps failing on: the
// lowest offset that failed, since when, how often and with what. Such a
// record holds its partition's position (the offset moves in order), so a
// partition that has one for minutes is stuck, whatever its lag says: the
// CatalogPartitionStuck alert (catalog_promotion_partition_stuck_seconds)
// and `promoflow status` (catalog.consumer_failures) show it, with the
// offset that `promoflow dlq park` takes. A record that stops failing is
// forgotten once it has not failed for the expiry.
type Stuck struct {
	mu     sync.Mutex
	heads  map[claimKey]*StuckPartition
	expiry time.Duration
}

// StuckPartition is a partition's failing record.
type StuckPartition struct {
	Topic     string    `json:"topic" db:"topic"`
	Partition int32     `json:"partition" db:"partition"`
	Offset    int64     `json:"offset" db:"offset"`
	Error     string    `json:"error" db:"error"`
	Attempts  int       `json:"attempts" db:"attempts"`
	Since     time.Time `json:"since" db:"first_failed_at"`
	Last      time.Time `json:"last" db:"last_failed_at"`
	stored    time.Time // when the row was last written
}

// StuckExpiryDefault is how long a record that stopped failing stays
// tracked: longer than the retry's longest backoff (RetryMaxIntervalDefault).
const StuckExpiryDefault = 150 * time.Second

// stuckStoreEvery is how often a partition's row is written at most.
const stuckStoreEvery = 5 * time.Second

// NewStuck tracks failing records, forgetting one after expiry without a
// failure (StuckExpiryDefault when 0).
func NewStuck(expiry time.Duration) *Stuck {
	return &Stuck{heads: map[claimKey]*StuckPartition{}, expiry: cmp.Or(expiry, StuckExpiryDefault)}
}

// SetExpiry sets the expiry: 2.5 times the retry's longest backoff.
func (s *Stuck) SetExpiry(expiry time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expiry = cmp.Or(expiry, StuckExpiryDefault)
}

// Failed records that msg's handling failed with err (RetryConfig.OnRetry),
// and writes the partition's row to db (when not nil) at most every 5 s.
func (s *Stuck) Failed(db *sqlx.DB, msg *message.Message, err error) {
	pos, ok := PositionOf(msg)
	if !ok {
		return
	}
	now := time.Now()
	s.mu.Lock()
	k := claimKey{pos.Topic, pos.Partition}
	h := s.heads[k]
	switch {
	case h == nil || now.Sub(h.Last) > s.expiry || pos.Offset < h.Offset:
		h = &StuckPartition{Topic: pos.Topic, Partition: pos.Partition, Offset: pos.Offset, Since: now}
		s.heads[k] = h
	case pos.Offset > h.Offset:
		s.mu.Unlock()
		return // behind the partition's lowest failing record
	}
	h.Attempts++
	h.Last, h.Error = now, err.Error()
	row := *h
	store := db != nil && now.Sub(h.stored) >= stuckStoreEvery
	if store {
		h.stored = now
	}
	s.mu.Unlock()
	if store {
		storeStuck(db, row)
	}
}

func storeStuck(db *sqlx.DB, r StuckPartition) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// Best effort: the database may be what fails.
	_, _ = db.NamedExecContext(ctx, `INSERT INTO catalog.consumer_failures AS f
			(topic, partition, "offset", error, attempts, first_failed_at, last_failed_at)
		VALUES (:topic, :partition, :offset, :error, :attempts, :first_failed_at, :last_failed_at)
		ON CONFLICT (topic, partition) DO UPDATE SET "offset" = EXCLUDED."offset", error = EXCLUDED.error,
			attempts = EXCLUDED.attempts, first_failed_at = EXCLUDED.first_failed_at, last_failed_at = EXCLUDED.last_failed_at`, r)
}

// Partitions are the partitions with a failing record now, oldest first.
func (s *Stuck) Partitions(now time.Time) []StuckPartition {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]StuckPartition, 0, len(s.heads))
	for k, h := range s.heads {
		if now.Sub(h.Last) > s.expiry {
			delete(s.heads, k)
			continue
		}
		out = append(out, *h)
	}
	slices.SortFunc(out, func(a, b StuckPartition) int { return a.Since.Compare(b.Since) })
	return out
}

// StuckInDB reads the partitions of topic whose stored failing record is
// still current (not passed by the stored offset, failed within expiry) and
// has failed for longer than limit.
func StuckInDB(ctx context.Context, db sqlx.QueryerContext, topic string, limit, expiry time.Duration) ([]StuckPartition, error) {
	var rows []StuckPartition
	if err := sqlx.SelectContext(ctx, db, &rows, `SELECT f.topic, f.partition, f."offset", f.error, f.attempts,
			f.first_failed_at, f.last_failed_at
		FROM catalog.consumer_failures f
		WHERE f.topic = $1 AND f.last_failed_at > now() - make_interval(secs => $2)
		  AND f.first_failed_at < now() - make_interval(secs => $3)
		  AND f."offset" >= coalesce((SELECT max(o.next_offset) FROM catalog.consumer_offsets o
			WHERE o.topic = f.topic AND o.partition = f.partition), 0)
		ORDER BY f.partition`, topic, expiry.Seconds(), limit.Seconds()); err != nil {
		return nil, fmt.Errorf("read stuck partitions: %w", err)
	}
	return rows, nil
}
