// Package purchase holds the PromotionPurchase aggregate: its validation, its
// transitions (INV-6) and its snapshot event.
package purchase

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/promoflow/promoflow/handlers/event"
)

// PaymentNotRequired is the payment status of a purchase made in no-payment
// mode (decision no. 10: payment is deferred).
const PaymentNotRequired = "NotRequired"

// MaxTargets bounds the targets of one purchase.
const MaxTargets = 100

// Transition errors. Callers test them with errors.Is.
var (
	// ErrTerminal: the purchase is Expired or Cancelled and takes no transition (INV-6).
	ErrTerminal = errors.New("purchase is in a terminal status")
	// ErrNotActive: the purchase is not Active, so it cannot expire.
	ErrNotActive = errors.New("purchase is not active")
	// ErrNotFound: no purchase with that id for that tenant.
	ErrNotFound = errors.New("purchase not found")
	// ErrVersionConflict: the row changed between read and write.
	ErrVersionConflict = errors.New("purchase version conflict")
)

// Purchase is one promotion purchase. Its JSON form is the purchase API's answer.
type Purchase struct {
	ID            uuid.UUID      `db:"id" json:"Id"`
	TenantID      uuid.UUID      `db:"tenant_id" json:"TenantId"`
	PackageKind   string         `db:"package_kind" json:"PackageKind"`
	Targets       []event.Target `db:"-" json:"Targets"`
	BoostWeight   int            `db:"boost_weight" json:"BoostWeight"`
	Status        event.Status   `db:"status" json:"Status"`
	PaymentStatus string         `db:"payment_status" json:"PaymentStatus"`
	StartsAt      time.Time      `db:"starts_at" json:"StartsAt"`
	EndsAt        time.Time      `db:"ends_at" json:"EndsAt"`
	CreatedAt     time.Time      `db:"created_at" json:"CreatedAt"`
	UpdatedAt     time.Time      `db:"updated_at" json:"UpdatedAt"`
	Version       int64          `db:"version" json:"Version"`
}

// Draft is what a caller asks to buy.
type Draft struct {
	PackageKind string
	Targets     []event.Target
	BoostWeight int
	StartsAt    time.Time
	EndsAt      time.Time
}

// FieldError names one invalid input field.
type FieldError struct {
	Field   string `json:"field"`
	Problem string `json:"problem"`
}

// ValidationError lists every problem of a Draft.
type ValidationError struct{ Fields []FieldError }

func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.Field + ": " + f.Problem
	}
	return "invalid purchase: " + strings.Join(parts, "; ")
}

// Validate checks targets (non-empty, known kinds, ids, no duplicates), the
// weight (1..100), the package kind and EndsAt > StartsAt.
func (d Draft) Validate() error {
	var fields []FieldError
	bad := func(field, problem string) { fields = append(fields, FieldError{field, problem}) }
	// ASCII blanks only and characters, not bytes: the OpenAPI document's
	// pattern and maxLength say the same.
	if strings.Trim(d.PackageKind, " \t\n\v\f\r") == "" || utf8.RuneCountInString(d.PackageKind) > 64 {
		bad("PackageKind", "must be 1..64 characters, not all blank")
	}
	if len(d.Targets) == 0 {
		bad("Targets", "must not be empty")
	}
	if len(d.Targets) > MaxTargets {
		bad("Targets", fmt.Sprintf("at most %d targets", MaxTargets))
	}
	seen := make(map[event.Target]bool, len(d.Targets))
	for i, t := range d.Targets {
		field := fmt.Sprintf("Targets[%d]", i)
		if !t.TargetKind.Valid() {
			bad(field+".TargetKind", "must be Project, PropertyObject or Post")
		}
		if t.TargetId == uuid.Nil {
			bad(field+".TargetId", "must be a non-empty UUID")
		}
		if seen[t] {
			bad(field, "duplicate target")
		}
		seen[t] = true
	}
	if d.BoostWeight < 1 || d.BoostWeight > 100 {
		bad("BoostWeight", "must be within 1..100")
	}
	for _, f := range []struct {
		name string
		t    time.Time
	}{{"StartsAt", d.StartsAt}, {"EndsAt", d.EndsAt}} {
		if !f.t.IsZero() && !event.InContract(f.t) {
			bad(f.name, "must be within 0001-01-01T00:00:00Z..9999-12-31T23:59:59Z in UTC")
		}
	}
	if d.StartsAt.IsZero() {
		bad("StartsAt", "is required")
	}
	if d.EndsAt.IsZero() {
		bad("EndsAt", "is required")
	} else if !d.EndsAt.After(d.StartsAt) {
		bad("EndsAt", "must be after StartsAt")
	}
	if len(fields) > 0 {
		return &ValidationError{Fields: fields}
	}
	return nil
}

// NewActive builds the purchase for a valid draft in no-payment mode, where a
// new purchase goes Pending → Active at once (version 1).
func NewActive(id, tenant uuid.UUID, d Draft, now time.Time) Purchase {
	return Purchase{
		ID: id, TenantID: tenant, PackageKind: d.PackageKind, Targets: d.Targets,
		BoostWeight: d.BoostWeight, Status: event.StatusActive, PaymentStatus: PaymentNotRequired,
		StartsAt: d.StartsAt.UTC().Truncate(time.Microsecond), EndsAt: d.EndsAt.UTC().Truncate(time.Microsecond),
		CreatedAt: now, UpdatedAt: now, Version: 1,
	}
}

// Check reports a stored purchase whose state breaks the aggregate's rules.
// The expirer leaves such a poison purchase Active and logs it.
func (p Purchase) Check() error {
	if !p.Status.Valid() {
		return fmt.Errorf("unknown status %q", p.Status)
	}
	d := Draft{PackageKind: p.PackageKind, Targets: p.Targets, BoostWeight: p.BoostWeight, StartsAt: p.StartsAt, EndsAt: p.EndsAt}
	if err := d.Validate(); err != nil {
		return err
	}
	if p.Version < 1 {
		return fmt.Errorf("version %d < 1", p.Version)
	}
	return nil
}

// Expire moves an Active purchase to Expired as of asOf (INV-6 guard).
func (p *Purchase) Expire(asOf time.Time) error {
	if p.Status != event.StatusActive {
		return fmt.Errorf("expire %s in status %s: %w", p.ID, p.Status, ErrNotActive)
	}
	p.transition(event.StatusExpired, asOf)
	return nil
}

// Cancel moves an Active or Pending purchase to Cancelled.
func (p *Purchase) Cancel(now time.Time) error {
	if p.Status.Terminal() {
		return fmt.Errorf("cancel %s in status %s: %w", p.ID, p.Status, ErrTerminal)
	}
	p.transition(event.StatusCancelled, now)
	return nil
}

func (p *Purchase) transition(to event.Status, at time.Time) {
	p.Status = to
	p.UpdatedAt = at
	p.Version++
}

// Event is the contract snapshot of the purchase's current state.
func (p Purchase) Event() event.PurchaseChanged {
	return event.PurchaseChanged{
		PurchaseId: p.ID, TenantId: p.TenantID, PackageKind: p.PackageKind, Targets: p.Targets,
		BoostWeight: p.BoostWeight, Status: p.Status, PaymentStatus: p.PaymentStatus,
		StartsAt: p.StartsAt, EndsAt: p.EndsAt, Version: p.Version,
	}
}
