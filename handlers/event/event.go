// Package event defines the PromotionPurchaseChanged contract of topic
// pin.promotion.purchase-changed.v1. The promotion context produces it and the
// catalog context consumes it; both import this package and nothing else
// defines the payload.
package event

import (
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Topic is the Kafka topic the outbox relays purchase changes to.
const Topic = "pin.promotion.purchase-changed.v1"

// ContractVersion is the version this build produces and expects.
const ContractVersion = "1"

// Event metadata keys. The Kafka publisher turns metadata into record headers.
const (
	HeaderContractVersion = "contract_version"
	HeaderEventType       = "event_type"
	HeaderAggregateType   = "aggregate_type"
	HeaderAggregateID     = "aggregate_id"
	HeaderOccurredAt      = "occurred_at"
	HeaderCorrelationID   = "correlation_id"
	HeaderTenantID        = "tenant_id"
)

// EventType and AggregateType are the values of the event_type and aggregate_type headers.
const (
	EventType     = "PromotionPurchaseChanged"
	AggregateType = "PromotionPurchase"
)

// Status is the lifecycle state of a purchase.
type Status string

// The purchase statuses. Expired and Cancelled are terminal (INV-6).
const (
	StatusPending   Status = "Pending"
	StatusActive    Status = "Active"
	StatusExpired   Status = "Expired"
	StatusCancelled Status = "Cancelled"
)

// Valid reports whether s is one of the four statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusPending, StatusActive, StatusExpired, StatusCancelled:
		return true
	}
	return false
}

// Terminal reports whether no transition leaves s (INV-6).
func (s Status) Terminal() bool { return s == StatusExpired || s == StatusCancelled }

// TargetKind is what a purchase promotes.
type TargetKind string

// The target kinds. Post targets belong to the news context.
const (
	TargetProject        TargetKind = "Project"
	TargetPropertyObject TargetKind = "PropertyObject"
	TargetPost           TargetKind = "Post"
)

// Valid reports whether k is one of the three target kinds.
func (k TargetKind) Valid() bool {
	return k == TargetProject || k == TargetPropertyObject || k == TargetPost
}

// InContract reports whether t, written in UTC as the producer writes every
// time, is a time of the contract: its year within 0001..9999 (the schema's
// four digits, and no year 0, which PostgreSQL cannot store).
func InContract(t time.Time) bool {
	y := t.UTC().Year()
	return y >= 1 && y <= 9999
}

// Target is one promoted entity.
type Target struct {
	TargetKind TargetKind `json:"TargetKind"`
	TargetId   uuid.UUID  `json:"TargetId"`
}

// PurchaseChanged is the JSON payload of one purchase state change. It carries no PII.
type PurchaseChanged struct {
	PurchaseId    uuid.UUID `json:"PurchaseId"`
	TenantId      uuid.UUID `json:"TenantId"`
	PackageKind   string    `json:"PackageKind"`
	Targets       []Target  `json:"Targets"`
	BoostWeight   int       `json:"BoostWeight"`
	Status        Status    `json:"Status"`
	PaymentStatus string    `json:"PaymentStatus"`
	StartsAt      time.Time `json:"StartsAt"`
	EndsAt        time.Time `json:"EndsAt"`
	Version       int64     `json:"Version"`
}

// ContractError is a payload that breaks the contract. Consumers dead-letter it
// without retry.
type ContractError struct {
	Field  string
	Reason string
	// joined: Reason lists several violations, each with its own field
	// (joinViolations); Field is the first one's.
	joined bool
}

func (e *ContractError) Error() string { return "contract violation: " + e.detail() }

// detail is the violation without the "contract violation: " prefix.
func (e *ContractError) detail() string {
	if e.Field == "" || e.joined {
		return e.Reason
	}
	return e.Field + ": " + e.Reason
}

// MaxTargets is the most targets an event may carry (the schema's
// maxItems): the catalog applies an event in one transaction (SPEC §5.8),
// within its unit-of-work timeout; the purchase API takes 100 at most.
const MaxTargets = 12000

// Validate checks the rules every consumer relies on: a purchase id and a tenant id, Version >= 1,
// BoostWeight 1..100, a known Status and well-formed targets.
func (e PurchaseChanged) Validate() error {
	if errs := e.violations(); len(errs) > 0 {
		return joinViolations(errs)
	}
	return nil
}

// violations lists Validate's *ContractErrors in field order.
func (e PurchaseChanged) violations() []error {
	var errs []error
	bad := func(field, reason string) { errs = append(errs, &ContractError{Field: field, Reason: reason}) }
	if e.PurchaseId == uuid.Nil {
		bad("PurchaseId", "must not be empty")
	}
	if e.TenantId == uuid.Nil {
		bad("TenantId", "must not be empty")
	}
	if e.Version < 1 {
		bad("Version", "must be >= 1")
	}
	if e.BoostWeight < 1 || e.BoostWeight > 100 {
		bad("BoostWeight", "must be within 1..100")
	}
	if !e.Status.Valid() {
		bad("Status", fmt.Sprintf("unknown status %q", e.Status))
	}
	if len(e.Targets) == 0 {
		bad("Targets", "must not be empty")
	}
	if len(e.Targets) > MaxTargets {
		bad("Targets", fmt.Sprintf("at most %d targets (has %d)", MaxTargets, len(e.Targets)))
	}
	for i, t := range e.Targets {
		if !t.TargetKind.Valid() {
			bad(fmt.Sprintf("Targets[%d].TargetKind", i), fmt.Sprintf("unknown kind %q", t.TargetKind))
		}
		if t.TargetId == uuid.Nil {
			bad(fmt.Sprintf("Targets[%d].TargetId", i), "must not be empty")
		}
	}
	return errs
}
