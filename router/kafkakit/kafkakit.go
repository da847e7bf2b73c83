// Package kafkakit is what every Kafka client of promoflow shares: the Sarama
// configurations, the topics and their settings, and the marshaler that keeps
// a record's key when a message is copied to another topic.
package kafkakit

import (
	"time"

	"github.com/IBM/sarama"
)

// KafkaVersion is the protocol version the clients speak. Kafka 4.x removed the
// versions before 2.1 (KIP-896) that watermill-kafka's defaults pin (1.0).
var KafkaVersion = sarama.V3_6_0_0

// ClientConfig is a Sarama client speaking KafkaVersion.
func ClientConfig(clientID string) *sarama.Config {
	c := sarama.NewConfig()
	c.ClientID = clientID
	c.Version = KafkaVersion
	return c
}

// DurableProducerConfig is a Sarama producer that does not lose an acknowledged
// event: acks=all, idempotent, one request in flight so retries keep order.
func DurableProducerConfig(clientID string) *sarama.Config {
	c := ClientConfig(clientID)
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Idempotent = true
	c.Net.MaxOpenRequests = 1
	c.Producer.Return.Successes = true
	c.Producer.Retry.Max = 10
	c.Producer.Retry.Backoff = 250 * time.Millisecond
	c.Metadata.Retry.Backoff = time.Second
	return c
}
