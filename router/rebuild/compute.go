package rebuild

import (
	"context"
	"errors"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/boost"
)

// compute sums every target's active weights in the new replica.
func (r *Rebuilder) compute(ctx context.Context, b boost.Build) error {
	return r.inTx(ctx, "compute sums", func(ctx context.Context, tx *sqlx.Tx) error {
		_, err := b.ComputeTx(ctx, tx)
		return errors.Join(err, r.at(ctx, pointCompute))
	})
}
