package rebuild

import (
	"context"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/boost"
)

// compute gathers the new tables' statistics; the load summed each slice's
// active weights as it went.
func (r *Rebuilder) compute(ctx context.Context, b boost.Build, cur *run) error {
	if err := r.inTx(ctx, "analyze new replica", func(ctx context.Context, tx *sqlx.Tx) error {
		return b.AnalyzeTx(ctx, tx, cur.staged)
	}); err != nil {
		return err
	}
	return r.at(ctx, pointCompute)
}
