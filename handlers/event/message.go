package event

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// NewMessage wraps ev in a Watermill message with a fresh UUID (the consumer's
// dedup MessageId) and the contract headers. occurredAt is written in UTC.
func NewMessage(ev PurchaseChanged, correlationID string, occurredAt time.Time) (*message.Message, error) {
	payload, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("marshal purchase changed: %w", err)
	}
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.Metadata.Set(HeaderContractVersion, ContractVersion)
	msg.Metadata.Set(HeaderEventType, EventType)
	msg.Metadata.Set(HeaderAggregateType, AggregateType)
	msg.Metadata.Set(HeaderAggregateID, ev.PurchaseId.String())
	msg.Metadata.Set(HeaderOccurredAt, occurredAt.UTC().Format(time.RFC3339Nano))
	msg.Metadata.Set(HeaderCorrelationID, correlationID)
	msg.Metadata.Set(HeaderTenantID, ev.TenantId.String())
	return msg, nil
}

// PartitionKey is the Kafka record key of a message: the purchase id, so that
// every change of one purchase lands on one partition in order.
func PartitionKey(_ string, msg *message.Message) (string, error) {
	key := msg.Metadata.Get(HeaderAggregateID)
	if key == "" {
		return "", fmt.Errorf("message %s has no %s header", msg.UUID, HeaderAggregateID)
	}
	return key, nil
}
