package middleware

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/lib/pq"
)

// ErrOffsetsLost is a transaction that found a partition's stored offset
// behind what this process had committed to it: the database lost commits
// (a failover to a standby that missed them, a restore), and the consumer
// seeks back.
var ErrOffsetsLost = errors.New("the catalog database lost committed consumer offsets")

// LossCheckInterval is how often a session compares the stored offsets with
// what the process committed, for the partitions no transaction touches.
const LossCheckInterval = 5 * time.Second

// checkNotLost compares the offsets of the partitions a transaction moved,
// as its statement found them (prev), with what this process had committed
// to them before the statement ran (had); the transaction's offsets were
// worked out in generation gen.
func (o *Offsets) checkNotLost(gen int, had, prev map[claimKey]int64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.gen != gen {
		return fmt.Errorf("%w: the claims were stopped", ErrOffsetsLost)
	}
	for k, want := range had {
		if prev[k] < want {
			o.lostLocked(k, want, prev[k])
			return fmt.Errorf("%w: partition %d of %s was stored at %d, the database has %d", ErrOffsetsLost,
				k.partition, k.topic, want, prev[k])
		}
	}
	return nil
}

// lostLocked ends every claim of the process, with o.mu held, once
// partition k was found at found after the process had committed want. The
// partitions it had committed to are marked for rewinding: the next session
// seeks one that has no row left to its oldest record, not to Kafka's
// committed offset, which is past what the database lost.
// Nothing of those claims is stored any more, neither by the transactions
// still under way nor by the session's cleanup: their records lie past what
// the database lost.
func (o *Offsets) lostLocked(k claimKey, want, found int64) {
	o.log.Error("consumer-offsets-lost", "topic", k.topic, "partition", k.partition, "committed", want,
		"found", found, "action", "ending the session to seek to the database's offsets")
	o.gen++
	for k := range o.committed {
		o.rewind[k] = true
	}
	clear(o.committed)
	clear(o.ended)
	for _, stop := range o.stops {
		stop()
	}
	clear(o.runs)
	clear(o.stops)
}

// watch compares, every interval until ctx ends, the stored offset of each
// partition this process committed to with what it committed: a partition
// that no record reaches after a failover is not checked by a transaction.
// A failed read is left to the next round (the database may be failing
// over).
func (o *Offsets) watch(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := o.verify(ctx); err != nil && ctx.Err() == nil {
			o.log.Debug("consumer-offsets-check-failed", "error", err.Error())
		}
	}
}

// verify reads the stored offsets of the partitions the process committed
// to, after it noted what it committed (each of those commits precedes the
// read), and compares.
func (o *Offsets) verify(ctx context.Context) error {
	o.mu.Lock()
	gen := o.gen
	var topics []string
	var parts []int32
	for k := range o.committed {
		topics, parts = append(topics, k.topic), append(parts, k.partition)
	}
	want := maps.Clone(o.committed)
	o.mu.Unlock()
	if len(want) == 0 {
		return nil
	}
	var rows []struct {
		Topic     string `db:"topic"`
		Partition int32  `db:"partition"`
		Next      int64  `db:"next_offset"`
	}
	if err := o.db.SelectContext(ctx, &rows, `SELECT o.topic, o.partition, max(o.next_offset) AS next_offset
		FROM catalog.consumer_offsets o JOIN unnest($1::text[], $2::int[]) AS r (t, p) ON o.topic = r.t AND o.partition = r.p
		GROUP BY 1, 2`, pq.Array(topics), pq.Array(parts)); err != nil {
		return fmt.Errorf("check consumer offsets: %w", err)
	}
	found := make(map[claimKey]int64, len(rows))
	for _, r := range rows {
		found[claimKey{r.Topic, r.Partition}] = r.Next
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.gen != gen {
		return nil
	}
	for k, w := range want {
		if found[k] < w {
			o.lostLocked(k, w, found[k])
			return nil
		}
	}
	return nil
}

// rewound takes the mark of topic's partition p set by lostLocked.
func (o *Offsets) rewound(topic string, p int32) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := claimKey{topic, p}
	marked := o.rewind[k]
	delete(o.rewind, k)
	return marked
}
