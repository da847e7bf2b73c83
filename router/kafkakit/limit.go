package kafkakit

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// recordBatchOverhead is what the broker counts of a batch of one record
// beyond the record: the log entry's offset and length (12 bytes) and the v2
// batch header (49).
const recordBatchOverhead = 61

// ErrNoSuchTopic is a topic the cluster does not have.
var ErrNoSuchTopic = errors.New("topic does not exist")

// RecordLimit is the largest record a topic takes, for a publisher that must
// know before it sends whether a record fits (the DLQ's, which otherwise
// retries a refused dead letter for ever).
type RecordLimit struct {
	// Topic is the topic written to.
	Topic string
	// MaxMessageBytes is the topic's max.message.bytes, or the broker's
	// message.max.bytes when the topic has no override: the largest record
	// batch the broker appends to it.
	MaxMessageBytes int
	// Marshaler writes messages as the topic's publisher does.
	Marshaler kafka.Marshaler
}

// Fits reports whether msg, written by Marshaler, fits the topic. It counts
// the record as Sarama does (ProducerMessage.ByteSize, every length at its
// widest), so that a record it accepts the broker accepts too. A message that
// does not marshal fits: its publish reports why.
func (l RecordLimit) Fits(msg *message.Message) bool {
	rec, err := l.Marshaler.Marshal(l.Topic, msg)
	if err != nil {
		return true
	}
	return recordBatchOverhead+rec.ByteSize(2) <= l.MaxMessageBytes
}

// Apply sets a producer's size limit to the topic's, in place of Sarama's
// default (1 MiB), so that it sends no batch that the broker refuses.
func (l RecordLimit) Apply(sc *sarama.Config) {
	sc.Producer.MaxMessageBytes = max(l.MaxMessageBytes-recordBatchOverhead, 1)
}

// RecordLimit reads the limit of the records of topic written by m: the
// topic's max.message.bytes when it overrides it, else the broker's
// message.max.bytes. It answers within ProbeTimeout, or when ctx ends, and
// reports a missing topic with ErrNoSuchTopic.
//
// A topic that does not exist yet gets the limit it will inherit (the
// broker's default) and the error ErrNoSuchTopic beside a usable limit.
func (c Cluster) RecordLimit(ctx context.Context, topic string, m kafka.Marshaler) (RecordLimit, error) {
	n, err := askAdmin(ctx, c, func(admin sarama.ClusterAdmin) (int, error) { return maxMessageBytes(admin, topic) })
	if err != nil {
		err = fmt.Errorf("max.message.bytes of %s: %w", topic, err)
		if n > 0 && errors.Is(err, ErrNoSuchTopic) {
			return RecordLimit{Topic: topic, MaxMessageBytes: n, Marshaler: m}, err
		}
		return RecordLimit{}, err
	}
	return RecordLimit{Topic: topic, MaxMessageBytes: n, Marshaler: m}, nil
}

// defaultMaxMessageBytes is Kafka's default message.max.bytes.
const defaultMaxMessageBytes = 1048588

func maxMessageBytes(admin sarama.ClusterAdmin, topic string) (int, error) {
	entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: topic,
		ConfigNames: []string{"max.message.bytes"}})
	if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		// Not there yet (created by another process, or by an operator
		// later): the broker's default is what it will inherit, and a
		// record the topic then refuses for its size goes by reference.
		if n, brokerErr := brokerMaxMessageBytes(admin); brokerErr == nil {
			return n, fmt.Errorf("%w: its limit is the broker's message.max.bytes, %d", ErrNoSuchTopic, n)
		}
		return defaultMaxMessageBytes, fmt.Errorf("%w: its limit is Kafka's default message.max.bytes, %d", ErrNoSuchTopic, defaultMaxMessageBytes)
	}
	if err != nil {
		return 0, fmt.Errorf("describe topic: %w", err)
	}
	var topicValue *sarama.ConfigEntry
	for i := range entries {
		if entries[i].Name == "max.message.bytes" {
			topicValue = &entries[i]
		}
	}
	if topicValue != nil && topicValue.Source == sarama.SourceTopic {
		return parseBytes("max.message.bytes", topicValue.Value)
	}
	n, brokerErr := brokerMaxMessageBytes(admin)
	if brokerErr == nil {
		return n, nil
	}
	// A principal that may not describe the brokers still reads the topic's
	// value, which is the broker's default it inherits.
	if topicValue != nil {
		return parseBytes("max.message.bytes", topicValue.Value)
	}
	return 0, brokerErr
}

// brokerMaxMessageBytes is the controller's message.max.bytes, the default
// of a topic without an override.
func brokerMaxMessageBytes(admin sarama.ClusterAdmin) (int, error) {
	brokers, controller, err := admin.DescribeCluster()
	if err != nil {
		return 0, fmt.Errorf("describe cluster: %w", err)
	}
	id := controller
	if len(brokers) > 0 && id < 0 {
		id = brokers[0].ID()
	}
	entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.BrokerResource,
		Name: strconv.Itoa(int(id)), ConfigNames: []string{"message.max.bytes"}})
	if err != nil {
		return 0, fmt.Errorf("describe broker %d: %w", id, err)
	}
	for _, e := range entries {
		if e.Name == "message.max.bytes" {
			return parseBytes(e.Name, e.Value)
		}
	}
	return 0, fmt.Errorf("broker %d reports no message.max.bytes", id)
}

func parseBytes(name, value string) (int, error) {
	n, err := strconv.Atoi(value)
	if err != nil || n <= recordBatchOverhead {
		return 0, fmt.Errorf("%s is %q, not a size in bytes above %d", name, value, recordBatchOverhead)
	}
	return n, nil
}

// NewLimitedPublisher is a durable publisher (DurableProducerConfig) of
// records that m writes to topic, which sends none larger than the topic
// takes; the returned limit tells beforehand whether a message fits.
func (c Cluster) NewLimitedPublisher(ctx context.Context, topic, clientID string, m kafka.Marshaler,
	wlog watermill.LoggerAdapter) (*kafka.Publisher, RecordLimit, error) {
	limit, err := c.RecordLimit(ctx, topic, m)
	if errors.Is(err, ErrNoSuchTopic) && limit.MaxMessageBytes > 0 {
		wlog.Info("the topic does not exist yet; records are sized to the limit it will inherit",
			watermill.LogFields{"topic": topic, "maxMessageBytes": limit.MaxMessageBytes})
	} else if err != nil {
		return nil, limit, err
	}
	sc := c.DurableProducerConfig(clientID)
	limit.Apply(sc)
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: c.Brokers, Marshaler: m, OverwriteSaramaConfig: sc}, wlog)
	if err != nil {
		return nil, limit, fmt.Errorf("publisher of %s: %w", topic, err)
	}
	return pub, limit, nil
}
