// Package bounded reads Kafka partitions from a start offset up to the end
// they had when the work began, for operator work that must finish while
// producers go on: the projection rebuild and the DLQ replay. Records that
// arrive later are never read, so a replay whose output comes back to its own
// input cannot feed on itself.
package bounded

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/promoflow/promoflow/router/kafkakit"
)

// Range is the offsets [From, End) of one partition.
type Range struct {
	Topic     string
	Partition int32
	// From is the first offset to read.
	From int64
	// End is the offset after the last record to read: the partition's end
	// when the work began.
	End int64
}

// Len is the number of offsets in r.
func (r Range) Len() int64 { return max(r.End-r.From, 0) }

// Partition is one partition's offsets at the time it was read.
type Partition struct {
	Topic     string
	Partition int32
	// Oldest is the first offset still in the log (above 0 once retention
	// or DeleteRecords removed the records before it).
	Oldest int64
	// Newest is the offset the next record will get.
	Newest int64
}

// Whole is the range of every record the partition holds.
func (p Partition) Whole() Range {
	return Range{Topic: p.Topic, Partition: p.Partition, From: p.Oldest, End: p.Newest}
}

// Handler handles one record. An error stops the read.
type Handler func(ctx context.Context, rec *sarama.ConsumerMessage) error

// Client reads partitions; it reports a consumer's errors (such as an offset
// that retention removed) instead of logging them.
type Client struct {
	client sarama.Client
}

// Memory of a read, whatever the number of partitions: each fetch asks at
// most fetchBytes of the broker, at most partitionBytes of one partition,
// and each partition's reader holds at most bufferedRecords decoded records.
const (
	fetchBytes      = 4 << 20
	partitionBytes  = 256 << 10
	bufferedRecords = 64
)

// Dial connects to the cluster. It reads read_committed, as every reader of
// the purchase topic must (kafkakit.Cluster.ClientConfig): a transactional
// relay's aborted records stay in the log (tail.go), and the ends it reads
// are the last stable offsets. Looking a topic up never creates it
// (ClientConfig, too).
func Dial(cluster kafkakit.Cluster, clientID string) (*Client, error) {
	cfg := cluster.ClientConfig(clientID)
	cfg.Consumer.Return.Errors = true
	cfg.Consumer.Fetch.MaxBytes, cfg.Consumer.Fetch.Default = fetchBytes, partitionBytes
	cfg.ChannelBufferSize = bufferedRecords
	c, err := sarama.NewClient(cluster.Brokers, cfg)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return &Client{client: c}, nil
}

// Admin is a cluster admin on the same connection. It closes with the
// client: do not close it.
func (c *Client) Admin() (sarama.ClusterAdmin, error) {
	admin, err := sarama.NewClusterAdminFromClient(c.client)
	if err != nil {
		return nil, fmt.Errorf("kafka admin: %w", err)
	}
	return admin, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.client.Close() }

// ErrNoTopic is a topic that does not exist.
var ErrNoTopic = errors.New("topic does not exist")

// Partitions reads the oldest and newest offset of every partition of topic.
func (c *Client) Partitions(topic string) ([]Partition, error) {
	if err := c.client.RefreshMetadata(topic); err != nil {
		if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			return nil, fmt.Errorf("%s: %w", topic, ErrNoTopic)
		}
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	parts, err := c.client.Partitions(topic)
	if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return nil, fmt.Errorf("%s: %w", topic, ErrNoTopic)
	}
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	out := make([]Partition, 0, len(parts))
	for _, p := range parts {
		part, err := c.partition(topic, p)
		if err != nil {
			return nil, err
		}
		out = append(out, part)
	}
	return out, nil
}

// partition reads the oldest and newest offset of topic/p.
func (c *Client) partition(topic string, p int32) (Partition, error) {
	oldest, err := c.client.GetOffset(topic, p, sarama.OffsetOldest)
	if err != nil {
		return Partition{}, fmt.Errorf("oldest offset of %s/%d: %w", topic, p, err)
	}
	newest, err := c.client.GetOffset(topic, p, sarama.OffsetNewest)
	if err != nil {
		return Partition{}, fmt.Errorf("newest offset of %s/%d: %w", topic, p, err)
	}
	return Partition{Topic: topic, Partition: p, Oldest: oldest, Newest: newest}, nil
}

// Read reads every range, each partition in offset order on its own
// goroutine, and returns when all reached their End, the first one failed
// (the others are stopped), or ctx ended. progress may be nil.
func (c *Client) Read(ctx context.Context, ranges []Range, handle Handler, progress *Progress) error {
	consumer, err := sarama.NewConsumerFromClient(c.client)
	if err != nil {
		return fmt.Errorf("kafka consumer: %w", err)
	}
	defer consumer.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(ranges))
	for _, r := range ranges {
		go func() {
			err := c.readOne(ctx, consumer, r, handle, progress)
			if err != nil {
				cancel()
			}
			errc <- err
		}()
	}
	var errs []error
	for range ranges {
		if err := <-errc; err != nil {
			errs = append(errs, err)
		}
	}
	// The first real failure, not the cancellations it caused.
	for _, err := range errs {
		if !errors.Is(err, context.Canceled) {
			return err
		}
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

func (c *Client) readOne(ctx context.Context, consumer sarama.Consumer, r Range, handle Handler, progress *Progress) error {
	if r.Len() == 0 {
		return nil
	}
	pc, err := consumer.ConsumePartition(r.Topic, r.Partition, r.From)
	if err != nil {
		return rangeError(r, r.From, err)
	}
	defer pc.AsyncClose()
	settled := func(next int64) (bool, error) { return c.settled(r.Topic, r.Partition, next, r.End) }
	return readRange(ctx, r, pc.Messages(), pc.Errors(), handle, progress, settled)
}

// ReadRange hands handle every record of r that arrives on msgs, in order, and
// returns once the record before r.End was handled. Records at or past r.End
// are never handled. A channel that closes early (a partition consumer stops
// when retention removed its next offset) and an error on errs end the read
// with an error, never a panic. errs may be nil; progress may be nil.
func ReadRange(ctx context.Context, r Range, msgs <-chan *sarama.ConsumerMessage, errs <-chan *sarama.ConsumerError,
	handle Handler, progress *Progress) error {
	return readRange(ctx, r, msgs, errs, handle, progress, nil)
}

// readRange is ReadRange that, when settled is set, also ends once settled
// says no record it would hand over is left before r.End (tail.go).
func readRange(ctx context.Context, r Range, msgs <-chan *sarama.ConsumerMessage, errs <-chan *sarama.ConsumerError,
	handle Handler, progress *Progress, settled func(next int64) (bool, error)) error {
	var tick <-chan time.Time
	if settled != nil {
		t := time.NewTicker(tailCheckAfter)
		defer t.Stop()
		tick = t.C
	}
	next, quiet := r.From, true
	for next < r.End {
		var rec *sarama.ConsumerMessage
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			if !quiet {
				quiet = true
				continue
			}
			done, err := settled(next)
			if err != nil {
				return rangeError(r, next, err)
			}
			if done {
				progress.advance(r.End - next)
				return nil
			}
			continue
		case cerr, ok := <-errs:
			if !ok {
				errs = nil // closed with the consumer; msgs tells the rest
				continue
			}
			return rangeError(r, next, cerr.Err)
		case m, ok := <-msgs:
			if !ok {
				return rangeError(r, next, errors.New("the partition consumer stopped"))
			}
			rec, quiet = m, false
		}
		if rec.Offset >= r.End {
			break
		}
		if err := handle(ctx, rec); err != nil {
			return err
		}
		progress.advance(rec.Offset + 1 - next)
		next = rec.Offset + 1
	}
	progress.advance(r.End - next)
	return nil
}

func rangeError(r Range, at int64, err error) error {
	if errors.Is(err, sarama.ErrOffsetOutOfRange) {
		return fmt.Errorf("read %s/%d at offset %d (range %d..%d): records were removed by retention or DeleteRecords: %w",
			r.Topic, r.Partition, at, r.From, r.End, err)
	}
	return fmt.Errorf("read %s/%d at offset %d (range %d..%d): %w", r.Topic, r.Partition, at, r.From, r.End, err)
}
