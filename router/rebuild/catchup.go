package rebuild

import (
	"context"
	"log/slog"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/router/bounded"
)

// catchUp folds the records past ends into the build, round after round,
// until at most SwitchRecords arrived past the last round's ends or CatchUps
// rounds ran; it returns the last round's ends. The first round always runs.
func (r *Rebuilder) catchUp(ctx context.Context, client *bounded.Client, b boost.Build, cur *run, log *slog.Logger, ends map[int32]int64) (map[int32]int64, error) {
	for round := 1; ; round++ {
		next, ranges, err := r.since(client, ends)
		if err != nil {
			return nil, err
		}
		if round > 1 && (records(ranges) <= int64(r.cfg.SwitchRecords) || round > r.cfg.CatchUps) {
			return ends, nil
		}
		cur.progress.Extend(ranges)
		copied, err := r.copy(ctx, client, b.Tail, ranges, cur, log, "")
		cur.staged.Tail += copied
		if err != nil {
			return nil, err
		}
		if err := r.at(ctx, pointCatchUp); err != nil {
			return nil, err
		}
		var folded boost.Folded
		if err := r.inTx(ctx, "fold catch-up", func(ctx context.Context, tx *sqlx.Tx) error {
			folded, err = b.FoldTx(ctx, tx, cur.staged)
			return err
		}); err != nil {
			return nil, err
		}
		cur.staged.Tail, cur.staged.Sums = 0, cur.staged.Sums+folded.Targets
		cur.catchUps.Add(1)
		ends = next
	}
}
