package middleware

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/event"
)

// DLQTopicDefault is the Promotion Boost consumer's dead-letter topic.
const DLQTopicDefault = "pin.catalog.promotion-boost-dlq.v1"

// Metadata keys PoisonQueue adds to a dead-lettered message (Kafka record headers).
const (
	// HeaderDLQReason is the human-readable cause (Permanent.Reason, at most 1 KiB).
	HeaderDLQReason = "x-dlq-reason"
	// HeaderDLQErrorCode is the machine-readable class (Permanent.Code).
	HeaderDLQErrorCode = "x-dlq-error-code"
	// HeaderSourceTopic is the topic the message was consumed from.
	HeaderSourceTopic = "x-source-topic"
	// HeaderOriginalPartition is the source record's Kafka partition.
	HeaderOriginalPartition = "x-original-partition"
	// HeaderOriginalOffset is the source record's Kafka offset.
	HeaderOriginalOffset = "x-original-offset"
	// HeaderDLQReplayCount is how many times the DLQ replay forwarded the
	// record; the replay increments it and parks records at its limit, and a
	// dead letter keeps it because every original header is kept.
	HeaderDLQReplayCount = "x-dlq-replay-count"
)

// maxReasonBytes bounds x-dlq-reason: a contract error joins every violation of
// the payload, and a header is for a reader, not for the whole story.
const maxReasonBytes = 1024

// PoisonConfig configures PoisonQueue.
type PoisonConfig struct {
	// Topic is the dead-letter topic. Defaults to DLQTopicDefault.
	Topic string
	// SourceTopic is written to x-source-topic when the message context names no
	// subscribed topic (the router always names it). Optional.
	SourceTopic string
	// ReplayTopic is the topic of DLQ replays: only a record read from it
	// keeps the origin headers it carries (its first origin). A record of any
	// other topic gets its own, whatever headers its producer wrote.
	ReplayTopic string
	// Logger receives the ERROR "dead-lettered" record. Defaults to slog.Default().
	Logger *slog.Logger
	// OnDeadLetter, if set, is called once for every dead-lettered message (for
	// catalog_promotion_dlq_total and its alert).
	OnDeadLetter func(msg *message.Message, p *Permanent)
	// Fits reports whether a dead letter fits the DLQ topic
	// (kafkakit.RecordLimit.Fits); one that does not is dead-lettered by
	// reference. Defaults to every dead letter fitting.
	Fits func(dlq *message.Message) bool
}

// topicName is what Kafka accepts as a topic name.
var topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

// Validate reports a DLQ topic name that Kafka would refuse.
func (c PoisonConfig) Validate() error {
	c.setDefaults() // a copy: what the component will run with
	if !topicName.MatchString(c.Topic) {
		return fmt.Errorf("dlq topic %q is not a Kafka topic name", c.Topic)
	}
	return nil
}

func (c *PoisonConfig) setDefaults() {
	c.Topic = cmp.Or(c.Topic, DLQTopicDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	if c.Fits == nil {
		c.Fits = func(*message.Message) bool { return true }
	}
}

// PoisonQueue publishes a message whose handler failed with a *Permanent error
// to the DLQ topic and acks it, so its partition keeps flowing. The DLQ message
// has the same UUID, the original payload bytes and all original metadata, plus
// x-dlq-reason, x-dlq-error-code, x-source-topic, x-original-partition and
// x-original-offset (the last two when the message came from watermill-kafka).
// A dead letter that does not fit the DLQ (Fits, or the broker refuses its
// size) goes by reference: no value, and x-dlq-by-reference,
// x-dlq-value-size and x-dlq-value-sha256 (poison_reference.go), so that no
// record holds its key for ever for its size.
// If the publish fails, the error is returned (nack, redelivery): a message is
// never dropped. Any other error passes through unchanged.
func PoisonQueue(pub message.Publisher, cfg PoisonConfig) (message.HandlerMiddleware, error) {
	cfg.setDefaults()
	var errs []error
	if pub == nil {
		errs = append(errs, errors.New("dlq publisher is required"))
	}
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("poison queue config: %w", err)
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			var perm *Permanent
			if err == nil || !errors.As(err, &perm) {
				return out, err
			}
			dlq, attrs := cfg.deadLetter(msg, perm)
			byRef, err := cfg.send(pub, msg, dlq)
			if err != nil {
				return nil, err
			}
			if byRef {
				attrs = append(attrs, "byReference", true, "valueBytes", len(msg.Payload))
			}
			cfg.Logger.ErrorContext(msg.Context(), "dead-lettered", attrs...)
			if cfg.OnDeadLetter != nil {
				cfg.OnDeadLetter(msg, perm)
			}
			return nil, nil
		}
	}, nil
}

// send publishes dlq, or its reference when it does not fit the DLQ (the
// broker may have a lower limit than the one read at start), and reports
// whether it sent the reference.
func (c PoisonConfig) send(pub message.Publisher, msg, dlq *message.Message) (byRef bool, err error) {
	if c.Fits(dlq) {
		err = c.publish(pub, msg, dlq)
		if !errors.Is(err, sarama.ErrMessageSizeTooLarge) {
			return false, err
		}
	}
	ref, err := byReference(msg, dlq, c.Fits)
	if err != nil {
		return false, err
	}
	return true, c.publish(pub, msg, ref)
}

// publish writes dlq under a span of its own in the trace of msg. The dead
// letter keeps msg's trace headers, the event's creation context, so that a
// replay of it continues that trace too.
func (c PoisonConfig) publish(pub message.Publisher, msg, dlq *message.Message) error {
	_, span := StartSpan(msg.Context(), "catalog.promotion.dead-letter", trace.SpanKindProducer, msg,
		semconv.MessagingDestinationName(c.Topic), semconv.MessagingOperationTypeSend,
		attribute.String("dlq.error_code", dlq.Metadata.Get(HeaderDLQErrorCode)))
	defer span.End()
	if err := pub.Publish(c.Topic, dlq); err != nil {
		err = fmt.Errorf("publish %s to dlq %s: %w", msg.UUID, c.Topic, err)
		EndSpan(span, err)
		return err
	}
	return nil
}

// deadLetter builds the DLQ message and the attributes of its log record.
func (c PoisonConfig) deadLetter(msg *message.Message, perm *Permanent) (*message.Message, []any) {
	ctx := msg.Context()
	reason := truncate(cmp.Or(perm.Reason, perm.Error()), maxReasonBytes)

	dlq := message.NewMessage(msg.UUID, slices.Clone(msg.Payload))
	dlq.Metadata = maps.Clone(msg.Metadata)
	if dlq.Metadata == nil {
		dlq.Metadata = message.Metadata{}
	}
	dlq.Metadata.Set(HeaderDLQReason, reason)
	dlq.Metadata.Set(HeaderDLQErrorCode, perm.Code)
	attrs := []any{
		"MessageId", msg.UUID,
		"PurchaseId", msg.Metadata.Get(event.HeaderAggregateID),
		"code", perm.Code,
		"reason", reason,
		"dlqTopic", c.Topic,
	}
	// A replayed record that fails again keeps its first origin: the DLQ
	// replay's ledger is keyed by it, so that each original is replayed
	// once however many copies of it the DLQ holds.
	first := c.ReplayTopic != "" && message.SubscribeTopicFromCtx(ctx) == c.ReplayTopic && hasOrigin(msg)
	if topic := cmp.Or(message.SubscribeTopicFromCtx(ctx), c.SourceTopic); topic != "" {
		if !first {
			dlq.Metadata.Set(HeaderSourceTopic, topic)
		}
		attrs = append(attrs, "sourceTopic", topic)
	}
	if p, ok := kafka.MessagePartitionFromCtx(ctx); ok {
		if !first {
			dlq.Metadata.Set(HeaderOriginalPartition, strconv.FormatInt(int64(p), 10))
		}
		attrs = append(attrs, "partition", p)
	}
	if o, ok := kafka.MessagePartitionOffsetFromCtx(ctx); ok {
		if !first {
			dlq.Metadata.Set(HeaderOriginalOffset, strconv.FormatInt(o, 10))
		}
		attrs = append(attrs, "offset", o)
	}
	dlq.SetContext(ctx)
	return dlq, attrs
}

// hasOrigin reports whether msg carries a first origin already: it is a
// replay of a dead letter.
func hasOrigin(msg *message.Message) bool {
	return msg.Metadata.Get(HeaderSourceTopic) != "" && msg.Metadata.Get(HeaderOriginalPartition) != "" &&
		msg.Metadata.Get(HeaderOriginalOffset) != ""
}

// DLQPartitionKey keys a dead-lettered record by its purchase id (the
// aggregate_id header), so a replay keeps per-purchase order, and falls back to
// the message UUID: a contract violation may lack the header, and a key error
// would stop the record from ever reaching the DLQ. Use it with
// kafka.NewWithPartitioningMarshaler for the DLQ publisher.
func DLQPartitionKey(_ string, msg *message.Message) (string, error) {
	return cmp.Or(msg.Metadata.Get(event.HeaderAggregateID), msg.UUID), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
