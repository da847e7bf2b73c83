package router

import (
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// relayPublisher is the relay's publisher: cfg.RelayPublisher, or a
// kafkakit.BatchPublisher bound by the guard's lease. With transactions
// (RelayProducerTransactionalID), each page the relay reads is one Kafka transaction
// of it (pages, nil otherwise: outbox.PageTransaction), whose failed commit
// makes the relay step back as a failed publish does.
func (p *Promotion) relayPublisher(cfg PromotionConfig, guard *outbox.PositionGuard, pinned func(string) int32,
	stepBack *outbox.StepBack) (message.Publisher, *outbox.PageTransaction, error) {
	if cfg.RelayPublisher != nil {
		return cfg.RelayPublisher, nil, nil
	}
	kp, err := kafkakit.NewBatchPublisher(kafkakit.BatchPublisherConfig{Cluster: cfg.Kafka, ClientID: "promoflow-promotion-relay",
		Marshaler: kafkakit.KeyedMarshaler{Key: event.PartitionKey}, Timeout: cfg.RelayPublishTimeout,
		Lease: guard.ValidUntil, Pinned: pinned, TransactionalID: cfg.RelayProducerTransactionalID()})
	if err != nil {
		return nil, nil, err
	}
	p.closers = append(p.closers, kp.Close)
	if cfg.RelayProducerTransactionalID() == "" {
		return kp, nil, nil
	}
	return kp, outbox.NewPageTransaction(stepBack.Pages(kp)), nil
}

// RelayTransactionsOff is the RelayTransactionalID that turns the relay's
// Kafka transactions off (a cluster that grants no TransactionalId ACL).
const RelayTransactionsOff = "off"

// RelayTransactionalIDFor is the relay's default transactional.id for the
// purchase topic: every process of one outbox publishes to the same topic.
func RelayTransactionalIDFor(topic string) string { return "promoflow-promotion-relay." + topic }

// RelayProducerTransactionalID is the transactional.id the relay's producer
// runs with: RelayTransactionalID with its default; empty when off.
func (c PromotionConfig) RelayProducerTransactionalID() string {
	c.setDefaults()
	if c.RelayTransactionalID == RelayTransactionsOff {
		return ""
	}
	return c.RelayTransactionalID
}
