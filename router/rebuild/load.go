package rebuild

import (
	"context"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/boost"
)

// load builds the new replica and its sums from the staged events, a slice
// per transaction (boost.Build.LoadSliceTx): none holds an xid for longer
// than a slice's share.
func (r *Rebuilder) load(ctx context.Context, b boost.Build, cur *run) error {
	if err := r.inTx(ctx, "create new replica", b.CreateReplicaTx); err != nil {
		return err
	}
	for k := range b.Events.Slices() {
		var loaded boost.Loaded
		if err := r.inTx(ctx, "load new replica", func(ctx context.Context, tx *sqlx.Tx) error {
			var err error
			loaded, err = b.LoadSliceTx(ctx, tx, k, cur.staged)
			return err
		}); err != nil {
			return err
		}
		cur.staged.Sums += loaded.Targets
		cur.purchases.Add(loaded.Purchases)
		cur.contributions.Add(loaded.Contributions)
		if k == 0 {
			if err := r.at(ctx, pointLoad); err != nil {
				return err
			}
		}
	}
	return nil
}

// slices is how many slices the load of records takes, each at most
// perSlice records.
func slices(records int64, perSlice int) int {
	return int(min(max((records+int64(perSlice)-1)/int64(perSlice), 1), maxSlices))
}

// maxSlices bounds the staging table's partitions: past 10M records at the
// default, slices grow rather than their number.
const maxSlices = 1024
