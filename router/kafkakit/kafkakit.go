// Package kafkakit is what every Kafka client of promoflow shares: the Sarama
// configurations with their security (TLS, SASL), the topics and their
// settings, and the marshaler that keeps a record's key when a message is
// copied to another topic.
package kafkakit

import (
	"errors"
	"time"

	"github.com/IBM/sarama"
)

// KafkaVersion is the protocol version the clients speak. Kafka 4.x removed the
// versions before 2.1 (KIP-896) that watermill-kafka's defaults pin (1.0).
var KafkaVersion = sarama.V3_6_0_0

// Cluster is a Kafka cluster as promoflow's clients reach it: its bootstrap
// brokers and the security of every connection. Every Sarama config comes
// from its methods, so no client can miss the security.
type Cluster struct {
	// Brokers are the bootstrap servers. Required.
	Brokers []string
	// Security is TLS and SASL; the zero value is plaintext.
	Security Security
}

// Validate reports a cluster without brokers.
func (c Cluster) Validate() error {
	if len(c.Brokers) == 0 {
		return errors.New("kafka brokers are required")
	}
	return nil
}

// ClientConfig is a Sarama client speaking KafkaVersion with the cluster's
// security. It never creates a topic it names: a topic deleted under a
// client (the relay's producer, the catalog's consumer group) would come
// back with the broker's defaults (one partition, cleanup.policy=delete)
// wherever the broker allows auto-creation; a missing topic is an error
// instead (sarama.ErrUnknownTopicOrPartition).
// Its consumers read read_committed: the relay publishes in
// transactions (BatchPublisherConfig.TransactionalID), and a record of an
// aborted or still open one (a frozen relay's) must never be seen.
func (c Cluster) ClientConfig(clientID string) *sarama.Config {
	sc := sarama.NewConfig()
	sc.ClientID = clientID
	sc.Version = KafkaVersion
	sc.Metadata.AllowAutoTopicCreation = false
	sc.Consumer.IsolationLevel = sarama.ReadCommitted
	c.Security.apply(sc)
	return sc
}

// DurableProducerConfig is a Sarama producer that does not lose an acknowledged
// event: acks=all, idempotent, one request in flight so retries keep order.
// Like every client of ClientConfig, it never creates a topic: a publish to
// a missing topic fails.
func (c Cluster) DurableProducerConfig(clientID string) *sarama.Config {
	sc := c.ClientConfig(clientID)
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Idempotent = true
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Return.Successes = true
	sc.Producer.Retry.Max = 10
	sc.Producer.Retry.Backoff = 250 * time.Millisecond
	sc.Metadata.Retry.Backoff = time.Second
	return sc
}
