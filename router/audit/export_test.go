package audit

import (
	"context"

	"github.com/promoflow/promoflow/handlers/event"
)

// SetAfterEnds sets the test seam run once the replica check read the
// topic's end offsets, before it reads the records and the replica.
func (a *Auditor) SetAfterEnds(f func(context.Context) error) { a.afterEnds = f }

// SetCheck sets how the replica check parses and checks each record it
// reads, in place of the consumer's checks (boost.CheckRecord).
func (a *Auditor) SetCheck(check func(key, value []byte) (event.PurchaseChanged, error)) {
	a.check = check
}
