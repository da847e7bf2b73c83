package event

import (
	"fmt"

	"github.com/google/uuid"
)

// KeyError is a record whose Kafka key is not its PurchaseId. The purchase
// topic is compacted by key, so such a record breaks "the latest event of a
// purchase" that compaction keeps, and with it the rebuild and the replica
// audit. Consumers dead-letter it without retry, as any contract violation.
type KeyError struct {
	// Key is the record's key; nil for a record without one.
	Key        []byte
	PurchaseId uuid.UUID
}

func (e *KeyError) Error() string {
	if e.Key == nil {
		return fmt.Sprintf("contract violation: the record has no key; its key must be its PurchaseId %s", e.PurchaseId)
	}
	return fmt.Sprintf("contract violation: record key %q is not its PurchaseId %s", e.Key, e.PurchaseId)
}

// CheckKey returns a *KeyError unless key is ev's PurchaseId as the payload
// writes it (lower-case canonical form), byte for byte: one spelling per
// purchase, so that compaction keeps one record per purchase.
func CheckKey(key []byte, ev PurchaseChanged) error {
	if string(key) != ev.PurchaseId.String() {
		return &KeyError{Key: key, PurchaseId: ev.PurchaseId}
	}
	return nil
}
