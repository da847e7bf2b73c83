package dlqreplay

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/bounded"
)

// A dead letter by reference (middleware.HeaderDLQByReference) carries no
// value: the record it stands for stays in its topic, and the replay fetches
// it from there. Compaction or retention may have removed it since, and a
// newer record may sit where it was; the replay then forwards nothing in its
// place (never another record) and counts the dead letter as skipped.

// errBrokenReference is a dead letter by reference whose record is gone or
// is another one.
var errBrokenReference = errors.New("the referenced record cannot be replayed")

// dereference returns what to replay for a dead letter read from rec: the
// dead letter itself, or the record it refers to, fetched and checked
// against its hash, with the dead letter's x-dlq headers (its replay count
// among them) in place of its own. An error wrapping
// errBrokenReference says why the record cannot be replayed; any other is a
// failure of the replay.
func (c Config) dereference(ctx context.Context, client *bounded.Client, rec *sarama.ConsumerMessage,
	msg *message.Message) (*message.Message, []byte, error) {
	if msg.Metadata.Get(middleware.HeaderDLQByReference) != "true" {
		return msg, rec.Key, nil
	}
	topic := msg.Metadata.Get(middleware.HeaderSourceTopic)
	if topic != c.SourceTopic && topic != c.ReplayTopic {
		return nil, nil, fmt.Errorf("%w: it names topic %q, neither the source topic %s nor the replay topic %s (see --source-topic)",
			errBrokenReference, topic, c.SourceTopic, c.ReplayTopic)
	}
	partition, perr := strconv.ParseInt(msg.Metadata.Get(middleware.HeaderOriginalPartition), 10, 32)
	offset, oerr := strconv.ParseInt(msg.Metadata.Get(middleware.HeaderOriginalOffset), 10, 64)
	want := msg.Metadata.Get(middleware.HeaderDLQValueSHA256)
	if err := errors.Join(perr, oerr); err != nil || want == "" {
		return nil, nil, fmt.Errorf("%w: its partition, offset or hash is unreadable: %v", errBrokenReference, err)
	}
	orig, err := client.Record(ctx, topic, int32(partition), offset)
	if errors.Is(err, bounded.ErrRecordGone) {
		return nil, nil, fmt.Errorf("%w: %w", errBrokenReference, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("fetch the record of dead letter %s/%d@%d: %w", rec.Topic, rec.Partition, rec.Offset, err)
	}
	sum := sha256.Sum256(orig.Value)
	if got := hex.EncodeToString(sum[:]); got != want {
		return nil, nil, fmt.Errorf("%w: %s/%d@%d holds a record of another hash (%s, not %s): it was superseded",
			errBrokenReference, topic, partition, offset, got, want)
	}
	out, err := kafka.DefaultMarshaler{}.Unmarshal(orig)
	if err != nil {
		return nil, nil, fmt.Errorf("unmarshal %s/%d@%d: %w", topic, partition, offset, err)
	}
	// The replay of a dead letter carries its x-dlq headers, by reference or not.
	for _, h := range []string{middleware.HeaderDLQReason, middleware.HeaderDLQErrorCode, middleware.HeaderSourceTopic,
		middleware.HeaderOriginalPartition, middleware.HeaderOriginalOffset, middleware.HeaderDLQReplayCount} {
		delete(out.Metadata, h)
		if v, ok := msg.Metadata[h]; ok {
			out.Metadata.Set(h, v)
		}
	}
	out.SetContext(msg.Context())
	return out, bytes.Clone(orig.Key), nil
}
