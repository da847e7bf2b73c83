package kafkakit

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"
)

// ErrFewerPartitions is a record for a topic that has fewer partitions than
// the count pinned for it: its key's partition may not exist.
var ErrFewerPartitions = errors.New("the topic has fewer partitions than pinned")

// PinnedHashPartitioner partitions a record by its key exactly as
// sarama.NewHashPartitioner does (FNV-1a 32-bit of the key bytes, modulo the
// count, sign dropped; a record without a key goes to a random partition),
// but modulo pinned(topic) rather than the topic's current count, whenever
// pinned answers above 0 (0: the current count, as Sarama does).
//
// Why: a topic whose partitions grew sends a key to another partition under
// the default partitioner, and a producer that has not refreshed its
// metadata yet (up to 10 minutes) still sends it to the old one, so one
// key's versions land in two partitions and a reader sees them out of
// order. Over the pinned count, every producer sends each key where it
// always went.
func PinnedHashPartitioner(pinned func(topic string) int32) sarama.PartitionerConstructor {
	return func(topic string) sarama.Partitioner {
		return pinnedPartitioner{Partitioner: sarama.NewHashPartitioner(topic), topic: topic, pinned: pinned}
	}
}

type pinnedPartitioner struct {
	sarama.Partitioner
	topic  string
	pinned func(topic string) int32
}

func (p pinnedPartitioner) Partition(msg *sarama.ProducerMessage, numPartitions int32) (int32, error) {
	n := p.pinned(p.topic)
	if n <= 0 {
		return p.Partitioner.Partition(msg, numPartitions)
	}
	if numPartitions < n {
		return -1, fmt.Errorf("topic %s: %d partitions, %d pinned: %w", p.topic, numPartitions, n, ErrFewerPartitions)
	}
	return p.Partitioner.Partition(msg, n)
}
