package bounded

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// Committed is group's committed offset of each of parts, by partition; a
// partition the group never committed is absent. parts are of one topic.
func (c *Client) Committed(group string, parts []Partition) (map[int32]int64, error) {
	out := map[int32]int64{}
	if len(parts) == 0 {
		return out, nil
	}
	admin, err := c.Admin()
	if err != nil {
		return nil, err
	}
	topic := parts[0].Topic
	ids := make([]int32, len(parts))
	for i, p := range parts {
		ids[i] = p.Partition
	}
	res, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: ids})
	if err != nil {
		return nil, fmt.Errorf("offsets of group %s: %w", group, err)
	}
	for _, p := range ids {
		if b := res.GetBlock(topic, p); b != nil && b.Offset >= 0 {
			out[p] = b.Offset
		}
	}
	return out, nil
}

// errHeadRead ends the read of one range at its first record.
var errHeadRead = errors.New("first record read")

// Heads reads the timestamp of the first record of each range, by partition:
// the oldest record a consumer at From has not handled yet. A range whose
// records are all gone (compaction) is absent.
func (c *Client) Heads(ctx context.Context, ranges []Range) (map[int32]time.Time, error) {
	var (
		mu   sync.Mutex
		out  = map[int32]time.Time{}
		wg   sync.WaitGroup
		errs = make([]error, len(ranges))
	)
	for i, r := range ranges {
		wg.Go(func() {
			err := c.Read(ctx, []Range{r}, func(_ context.Context, rec *sarama.ConsumerMessage) error {
				mu.Lock()
				out[r.Partition] = rec.Timestamp
				mu.Unlock()
				return errHeadRead
			}, nil)
			if !errors.Is(err, errHeadRead) {
				errs[i] = err
			}
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}
