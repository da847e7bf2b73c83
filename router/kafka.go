package router

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// watermillLogger is the logger Watermill's components take.
type watermillLogger = watermill.LoggerAdapter

// Defaults of ConsumerBuffers. A fetch asks 64 KiB of each partition and
// 4 MiB over all of them; Kafka still returns a record batch larger than
// the partition's share whole, but only to the first partition of a fetch
// that has one, so a topic of 1 MiB batches comes a batch a fetch. Each
// partition queues up to 4,096 records, which holds such a batch, so the
// next fetch goes out at once and serves another partition; the read-ahead
// of 16 MiB over every partition is what stops it. A catalog catching up
// 100,000 events on 48 partitions peaked at 91-93 MB of RSS with them, from
// our relay's small batches and from 1 MiB ones alike
// (docs/runbooks/catalog-promotion-boost.md, "Memory").
const (
	FetchPartitionBytesDefault = 64 << 10
	FetchResponseBytesDefault  = 4 << 20
	ReadAheadDefault           = 4096
	ReadAheadBytesDefault      = 16 << 20
)

// ConsumerBuffers sizes what a consumer holds in memory beside the record
// in flight on each partition, which is what a backlog fills. Sarama decodes
// a fetch response in place: every record of it points into the response's
// one buffer (or into its batch's decompressed one), so the buffer stays
// until the last of its records is handled. Sarama's defaults (1 MiB a
// partition, 50 MiB a response, 256 records read ahead) held about 84 MiB
// of live heap, 250 MB of RSS, while one process caught up 100,000 events
// on 48 partitions.
type ConsumerBuffers struct {
	// FetchPartitionBytes is the most one fetch asks of each partition
	// (Sarama's Consumer.Fetch.Default); a record batch larger than it still
	// comes whole. Defaults to FetchPartitionBytesDefault.
	FetchPartitionBytes int
	// FetchResponseBytes caps one fetch response over every partition
	// (Consumer.Fetch.MaxBytes); the partitions left out are fetched next.
	// Defaults to FetchResponseBytesDefault.
	FetchResponseBytes int
	// ReadAhead is how many fetched records each partition may queue for
	// the handler (ChannelBufferSize). Defaults to ReadAheadDefault.
	ReadAhead int
	// ReadAheadBytes caps the records fetched and not yet handled over every
	// partition, each counted as its key, value and headers plus 1 KiB.
	// Defaults to ReadAheadBytesDefault.
	ReadAheadBytes int
	// Lanes is how many records of one partition are handled at once, the
	// records of one key one after the other (lanes). 1 hands a partition's
	// records one at a time. Defaults to LanesDefault.
	Lanes int
	// InFlight caps the records handed to lanes and not yet acked, over
	// every partition. Defaults to InFlightDefault; the catalog sets it to
	// what its group commit applies at once.
	InFlight int
}

func (c *ConsumerBuffers) setDefaults() {
	c.FetchPartitionBytes = cmp.Or(c.FetchPartitionBytes, FetchPartitionBytesDefault)
	c.FetchResponseBytes = cmp.Or(c.FetchResponseBytes, FetchResponseBytesDefault)
	c.ReadAhead = cmp.Or(c.ReadAhead, ReadAheadDefault)
	c.ReadAheadBytes = cmp.Or(c.ReadAheadBytes, ReadAheadBytesDefault)
	c.Lanes = cmp.Or(c.Lanes, LanesDefault)
	c.InFlight = cmp.Or(c.InFlight, InFlightDefault)
}

// WithDefaults is c with its zero fields at their defaults.
func (c ConsumerBuffers) WithDefaults() ConsumerBuffers {
	c.setDefaults()
	return c
}

// Validate reports sizes Sarama would refuse.
func (c ConsumerBuffers) Validate() error {
	c.setDefaults() // a copy: what the subscriber will run with
	var errs []error
	if c.FetchPartitionBytes < 1 || c.FetchResponseBytes < c.FetchPartitionBytes {
		errs = append(errs, errors.New("consumer fetch bytes must be positive, a response's at least a partition's"))
	}
	if c.ReadAhead < 1 || c.ReadAheadBytes < 1 {
		errs = append(errs, errors.New("consumer read-ahead (records and bytes) must be positive"))
	}
	if c.Lanes < 1 || c.Lanes > maxLanes {
		errs = append(errs, fmt.Errorf("consumer lanes must be between 1 and %d", maxLanes))
	}
	if c.InFlight < 1 {
		errs = append(errs, errors.New("consumer records in flight must be positive"))
	}
	return errors.Join(errs...)
}

func (c ConsumerBuffers) apply(sc *sarama.Config) {
	c.setDefaults()
	sc.Consumer.Fetch.Default = int32(c.FetchPartitionBytes)
	sc.Consumer.Fetch.MaxBytes = int32(c.FetchResponseBytes)
	sc.ChannelBufferSize = c.ReadAhead
}

// NewConsumerGroupSubscriber is a Kafka subscriber of a consumer group that
// starts from the earliest offset when the group has none, with buffers
// sized by buffers (zero fields: their defaults). Its read-ahead in bytes
// counts a record as handled once the returned middleware, which goes
// outermost on the subscriber's handler, has seen the handler return.
// tracer and gauge (the bytes read ahead) may be nil. With offsets set,
// each session starts every claimed partition at the offset the database
// stored, when it has one (middleware.Offsets); nil: at Kafka's committed
// offset.
func NewConsumerGroupSubscriber(cluster kafkakit.Cluster, group string, buffers ConsumerBuffers, wlog watermillLogger,
	tracer kafka.SaramaTracer, gauge prometheus.Gauge, offsets *middleware.Offsets) (*kafka.Subscriber, message.HandlerMiddleware, error) {
	if err := buffers.Validate(); err != nil {
		return nil, nil, err
	}
	buffers.setDefaults()
	sc := cluster.ClientConfig("promoflow-" + group)
	sc.Consumer.Return.Errors = true
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	buffers.apply(sc)
	if tracer == nil {
		tracer = middleware.HandlerTracer(nil)
	}
	gate := newReadAhead(int64(buffers.ReadAheadBytes), gauge)
	sc.Consumer.Interceptors = append(sc.Consumer.Interceptors, gate)
	// An eager strategy, where every rebalance ends the session: that end is
	// how middleware.Claims tells Retry that a partition was taken away. A
	// cooperative strategy (cooperative-sticky) keeps the session of a member
	// across rebalances and revokes partitions one by one, so a retry would go
	// on for a partition that moved. Pinned here, not left to Sarama's default.
	sc.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRange()}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: cluster.Brokers, Unmarshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc, ConsumerGroup: group,
		// A nack (a failed DLQ publish, a shutdown) redelivers after 1s, not in a hot loop.
		NackResendSleep: time.Second,
		Tracer:          gate.Tracer(laneTracer{SaramaTracer: tracer, n: buffers.Lanes, inFlight: buffers.InFlight, offsets: offsets}),
	}, wlog)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka subscriber %s: %w", group, err)
	}
	return sub, gate.Middleware, nil
}
