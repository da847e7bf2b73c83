package rebuild

import (
	"context"
	"errors"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/boost"
)

// load builds the new replica from the staged events.
func (r *Rebuilder) load(ctx context.Context, b boost.Build, cur *run) error {
	return r.inTx(ctx, "load new replica", func(ctx context.Context, tx *sqlx.Tx) error {
		built, err := b.LoadTx(ctx, tx)
		cur.purchases.Store(built.Purchases)
		cur.contributions.Store(built.Contributions)
		return errors.Join(err, r.at(ctx, pointLoad))
	})
}
