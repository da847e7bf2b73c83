package rebuild

import (
	"context"

	"github.com/promoflow/promoflow/handlers/boost"
)

// compute gathers the new tables' statistics; the load summed each slice's
// active weights as it went.
func (r *Rebuilder) compute(ctx context.Context, b boost.Build) error {
	if err := r.inTx(ctx, "analyze new replica", b.AnalyzeTx); err != nil {
		return err
	}
	return r.at(ctx, pointCompute)
}
