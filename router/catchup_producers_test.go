package router_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// producerShape is how a benchmark's topic gets its records: as the relay
// writes them (batchBytes 0), or by franz-go with record batches of up to
// batchBytes before compression and codec, as a producer other than ours
// writes them (a backfill, a mirror, another service).
type producerShape struct {
	name       string
	batchBytes int32
	codec      kgo.CompressionCodec
}

// relayShape is the relay's own writes: 500 records a request, a few a
// partition batch.
var relayShape = producerShape{name: "relay"}

// franzShape is franz-go with batches of up to batchBytes and codec.
func franzShape(batchBytes int32, codecName string, codec kgo.CompressionCodec) producerShape {
	size := fmt.Sprintf("%dKiB", batchBytes>>10)
	if batchBytes >= 1<<20 {
		size = fmt.Sprintf("%dMiB", batchBytes>>20)
	}
	return producerShape{name: "franz-go-" + size + "-" + codecName, batchBytes: batchBytes, codec: codec}
}

// catchUpShapes are the producers BenchmarkCatalogCatchUp fills its topic
// with: the relay, and franz-go with batches of 16 KiB, 256 KiB and 1 MiB,
// each uncompressed and snappy, lz4 and zstd; under -short the relay and
// franz-go's 16 KiB and 1 MiB snappy.
func catchUpShapes() []producerShape {
	if testing.Short() {
		return []producerShape{relayShape, franzShape(16<<10, "snappy", kgo.SnappyCompression()),
			franzShape(1<<20, "snappy", kgo.SnappyCompression())}
	}
	shapes := []producerShape{relayShape}
	for _, size := range []int32{16 << 10, 256 << 10, 1 << 20} {
		for _, c := range []struct {
			name  string
			codec kgo.CompressionCodec
		}{{"none", kgo.NoCompression()}, {"snappy", kgo.SnappyCompression()},
			{"lz4", kgo.Lz4Compression()}, {"zstd", kgo.ZstdCompression()}} {
			shapes = append(shapes, franzShape(size, c.name, c.codec))
		}
	}
	return shapes
}

// produce puts the bench's messages on topic in shape s, keyed by PurchaseId.
func (s producerShape) produce(b *testing.B, cb *consumerBench, topic string) {
	if s.batchBytes == 0 {
		produceAll(b, cb, topic)
		return
	}
	// A producer's usual settings beside the batch: acks=all, idempotent,
	// records buffered while requests are in flight, so that batches fill.
	client, err := kgo.NewClient(kgo.SeedBrokers(kafkatest.Brokers(b)...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerBatchMaxBytes(s.batchBytes), kgo.ProducerBatchCompression(s.codec),
		kgo.ProducerLinger(time.Second), kgo.MaxBufferedRecords(len(cb.msgs)+1))
	require.NoError(b, err)
	defer client.Close()
	marshaler := kafka.NewWithPartitioningMarshaler(event.PartitionKey)
	records := make([]*kgo.Record, 0, len(cb.msgs))
	for _, msg := range cb.msgs {
		pm, err := marshaler.Marshal(topic, msg)
		require.NoError(b, err)
		key, err := pm.Key.Encode()
		require.NoError(b, err)
		value, err := pm.Value.Encode()
		require.NoError(b, err)
		r := &kgo.Record{Key: key, Value: value}
		for _, h := range pm.Headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: string(h.Key), Value: h.Value})
		}
		records = append(records, r)
	}
	// ProduceSync buffers every record before it waits, so batches fill.
	require.NoError(b, client.ProduceSync(context.Background(), records...).FirstErr(), "franz-go produce")
}

// batchShape is what a topic's record batches hold, as a consumer reads them.
type batchShape struct {
	batches, records int
	bytes, maxBytes  int // on the wire: compressed, without the batch header
}

func (s batchShape) String() string {
	if s.batches == 0 {
		return "no batch"
	}
	return fmt.Sprintf("%d batches: %.1f records and %.1f KiB a batch on average, %.1f KiB at most",
		s.batches, float64(s.records)/float64(s.batches), float64(s.bytes)/float64(s.batches)/1024, float64(s.maxBytes)/1024)
}

// report adds the shape to b's metrics.
func (s batchShape) report(b *testing.B) {
	if s.batches == 0 {
		return
	}
	b.ReportMetric(float64(s.records)/float64(s.batches), "records/batch")
	b.ReportMetric(float64(s.bytes)/float64(s.batches)/1024, "KiB/batch")
	b.ReportMetric(float64(s.maxBytes)/1024, "max-KiB/batch")
}

// topicBatchShape reads the n records of topic with franz-go and returns the
// shape of the record batches they came in.
func topicBatchShape(b *testing.B, topic string, n int) batchShape {
	var mu sync.Mutex
	var shape batchShape
	client, err := kgo.NewClient(kgo.SeedBrokers(kafkatest.Brokers(b)...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.WithHooks(batchHook{&mu, &shape}))
	require.NoError(b, err)
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for got := 0; got < n; {
		fetches := client.PollFetches(ctx)
		require.NoError(b, ctx.Err(), "read %d of the topic's %d records", got, n)
		fetches.EachError(func(_ string, _ int32, err error) { require.NoError(b, err) })
		got += fetches.NumRecords()
	}
	mu.Lock()
	defer mu.Unlock()
	return shape
}

// batchHook adds each fetched record batch to a batchShape.
type batchHook struct {
	mu    *sync.Mutex
	shape *batchShape
}

func (h batchHook) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.shape.batches++
	h.shape.records += m.NumRecords
	h.shape.bytes += m.CompressedBytes
	h.shape.maxBytes = max(h.shape.maxBytes, m.CompressedBytes)
}
