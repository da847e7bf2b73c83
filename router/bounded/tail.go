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
	n, open, err := c.scan(Range{Topic: topic, Partition: partition, From: from, End: end}, true)
	return n == 0 && !open, err
}

// Records counts the records of r that a read_committed consumer reads: its
// offsets less the transaction markers and aborted records among them (the
// records of a transaction still open count). It fetches the whole range.
func (c *Client) Records(r Range) (int64, error) {
	n, _, err := c.scan(r, false)
	return n, err
}

// scan counts the records of r a read_committed consumer delivers, stopping
// at the first when first is set; open reports a transaction still open
// below r.End.
func (c *Client) scan(r Range, first bool) (n int64, open bool, err error) {
	broker, err := c.client.Leader(r.Topic, r.Partition)
	if err != nil {
		return 0, false, fmt.Errorf("leader of %s/%d: %w", r.Topic, r.Partition, err)
	}
	for from := r.From; from < r.End; {
		req := &sarama.FetchRequest{Version: 11, MaxBytes: fetchBytes, Isolation: sarama.ReadCommitted, SessionEpoch: -1}
		req.AddBlock(r.Topic, r.Partition, from, partitionBytes, -1)
		resp, err := broker.Fetch(req)
		if err != nil {
			return n, open, fmt.Errorf("fetch %s/%d at %d: %w", r.Topic, r.Partition, from, err)
		}
		block := resp.GetBlock(r.Topic, r.Partition)
		if block == nil {
			return n, open, sarama.ErrIncompleteResponse
		}
		if block.Err != sarama.ErrNoError {
			return n, open, fmt.Errorf("fetch %s/%d at %d: %w", r.Topic, r.Partition, from, block.Err)
		}
		open = open || block.LastStableOffset < r.End
		next, visible := visibleIn(block, from, r.End)
		n += visible
		if (first && (n > 0 || open)) || next <= from {
			return n, open, nil
		}
		from = next
	}
	return n, open, nil
}

// visibleIn counts the records of block in [from, end) that a read_committed
// consumer delivers, and returns the offset after its last whole batch.
func visibleIn(block *sarama.FetchResponseBlock, from, end int64) (next, visible int64) {
	aborted := slices.Clone(block.AbortedTransactions)
	slices.SortFunc(aborted, func(a, b *sarama.AbortedTransaction) int { return cmp.Compare(a.FirstOffset, b.FirstOffset) })
	abortedBy := map[int64]bool{}
	next = from
	for _, recs := range block.RecordsSet {
		b := recs.RecordBatch
		if b == nil {
			return next, visible + 1 // a legacy message set: not a transactional producer's
		}
		if b.FirstOffset >= end {
			return end, visible
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
					visible++
				}
			}
		}
		if !b.PartialTrailingRecord {
			next = b.LastOffset() + 1
		}
	}
	return next, visible
}
