package rebuild

import (
	"context"

	"github.com/promoflow/promoflow/handlers/event"
)

// Point is a place in a rebuild where the test seam runs.
type Point = point

// The points of the test seam, in the order a rebuild reaches them.
const (
	PointBeforeEnds   = pointBeforeEnds
	PointEnds         = pointEnds
	PointRead         = pointRead
	PointLoad         = pointLoad
	PointCompute      = pointCompute
	PointCatchUp      = pointCatchUp
	PointSwitchLocked = pointSwitchLocked
	PointSwitch       = pointSwitch
)

// SetHook sets the test seam: h runs at every point of a rebuild.
func (r *Rebuilder) SetHook(h func(context.Context, Point) error) { r.hook = h }

// SetCheck sets how the rebuild parses and checks each record it reads, in
// place of the consumer's checks (boost.CheckRecord).
func (r *Rebuilder) SetCheck(check func(key, value []byte) (event.PurchaseChanged, error)) {
	r.check = check
}
