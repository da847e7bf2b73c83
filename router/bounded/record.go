package bounded

import (
	"context"
	"errors"
	"fmt"

	"github.com/IBM/sarama"
)

// ErrRecordGone is an offset whose record the log no longer holds.
var ErrRecordGone = errors.New("the record is no longer in the log")

// Record reads the record at offset of topic/partition. It reports
// ErrRecordGone when the log no longer holds it: retention or DeleteRecords
// removed the offsets up to it, or compaction removed it (the first record
// at or after the offset has another one). It never returns another record.
func (c *Client) Record(ctx context.Context, topic string, partition int32, offset int64) (*sarama.ConsumerMessage, error) {
	part, err := c.partition(topic, partition)
	if err != nil {
		return nil, err
	}
	if offset < part.Oldest || offset >= part.Newest {
		return nil, fmt.Errorf("%s/%d@%d: the log holds offsets %d..%d: %w", topic, partition, offset, part.Oldest, part.Newest-1, ErrRecordGone)
	}
	var rec *sarama.ConsumerMessage
	err = c.Read(ctx, []Range{{Topic: topic, Partition: partition, From: offset, End: part.Newest}},
		func(_ context.Context, m *sarama.ConsumerMessage) error {
			rec = m
			return errHeadRead
		}, nil)
	switch {
	case errors.Is(err, sarama.ErrOffsetOutOfRange):
		return nil, fmt.Errorf("%s/%d@%d: removed since: %w", topic, partition, offset, ErrRecordGone)
	case err == nil: // only transaction markers and aborted records left
		return nil, fmt.Errorf("%s/%d@%d: no record from there: %w", topic, partition, offset, ErrRecordGone)
	case !errors.Is(err, errHeadRead):
		return nil, err
	case rec.Offset != offset:
		return nil, fmt.Errorf("%s/%d@%d: compaction removed it (the next record is at %d): %w",
			topic, partition, offset, rec.Offset, ErrRecordGone)
	}
	return rec, nil
}
