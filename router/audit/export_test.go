package audit

import "context"

// SetAfterEnds sets the test seam run once the replica check read the
// topic's end offsets, before it reads the records and the replica.
func (a *Auditor) SetAfterEnds(f func(context.Context) error) { a.afterEnds = f }
