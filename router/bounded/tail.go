package bounded

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/IBM/sarama"
)

// A range's last offsets may hold no record a consumer delivers: the relay
// publishes in Kafka transactions, and each one ends with a marker (a control
// record) on every partition it wrote, which takes an offset; a read_committed
// consumer also skips the records of an aborted transaction. A read that
// waited for the record before End would then wait for ever. So, when no
// record has come for tailCheckAfter, the reader asks the partition's leader
// whether any record it would deliver remains before End (settled).

// tailCheckAfter is how long a read waits for a record before it checks
// whether any is left to come.
const tailCheckAfter = 250 * time.Millisecond

// settled reports whether no record a read_committed consumer delivers is
// left in [from, end) of topic/partition: only transaction markers and
// aborted records, and no transaction still open below end.
func (c *Client) settled(topic string, partition int32, from, end int64) (bool, error) {
	broker, err := c.client.Leader(topic, partition)
	if err != nil {
		return false, fmt.Errorf("leader of %s/%d: %w", topic, partition, err)
	}
	for from < end {
		req := &sarama.FetchRequest{Version: 11, MaxBytes: fetchBytes, Isolation: sarama.ReadCommitted, SessionEpoch: -1}
		req.AddBlock(topic, partition, from, partitionBytes, -1)
		resp, err := broker.Fetch(req)
		if err != nil {
			return false, fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, from, err)
		}
		block := resp.GetBlock(topic, partition)
		if block == nil {
			return false, sarama.ErrIncompleteResponse
		}
		if block.Err != sarama.ErrNoError {
			return false, fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, from, block.Err)
		}
		if block.LastStableOffset < end {
			return false, nil // a transaction below end is still open
		}
		next, visible := visibleBefore(block, from, end)
		if visible || next <= from {
			return false, nil
		}
		from = next
	}
	return true, nil
}

// visibleBefore reports whether block holds a record in [from, end) that a
// read_committed consumer delivers, and the offset after its last batch.
func visibleBefore(block *sarama.FetchResponseBlock, from, end int64) (next int64, visible bool) {
	aborted := slices.Clone(block.AbortedTransactions)
	slices.SortFunc(aborted, func(a, b *sarama.AbortedTransaction) int { return cmp.Compare(a.FirstOffset, b.FirstOffset) })
	abortedBy := map[int64]bool{}
	next = from
	for _, recs := range block.RecordsSet {
		b := recs.RecordBatch
		if b == nil {
			return next, true // a legacy message set: not a transactional producer's
		}
		if b.FirstOffset >= end {
			return end, false
		}
		for len(aborted) > 0 && aborted[0].FirstOffset <= b.LastOffset() {
			abortedBy[aborted[0].ProducerID] = true
			aborted = aborted[1:]
		}
		switch {
		case b.Control:
			delete(abortedBy, b.ProducerID) // the transaction ends here
		case b.IsTransactional && abortedBy[b.ProducerID]:
		default:
			for _, r := range b.Records {
				if off := b.FirstOffset + r.OffsetDelta; off >= from && off < end {
					return next, true
				}
			}
		}
		if !b.PartialTrailingRecord {
			next = b.LastOffset() + 1
		}
	}
	return next, false
}
