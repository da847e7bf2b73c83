package rebuild

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/promoflow/promoflow/handlers/boost"
)

// saveProgress writes the progress every StatusEvery until stopped, which
// renews the rebuild's lease; it cancels the rebuild when the lease was lost.
func (r *Rebuilder) saveProgress(ctx context.Context, cur *run) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(r.cfg.StatusEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				err := saveStatus(ctx, r.cfg.DB, cur.status(StateRunning))
				switch {
				case cur.switched.Load():
					return // the switch recorded the rebuild done
				case errors.Is(err, errLeaseLost):
					// Another rebuild runs now: this one stops rather than race it.
					cur.cancel(err)
					return
				case err != nil && ctx.Err() == nil:
					r.cfg.Log.Warn("rebuild progress not saved", "rebuildId", cur.id.String(), "error", err.Error())
				}
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { cancel(); wg.Wait() }) }
}

// finish records a failure (the switch recorded a success itself), drops the
// rebuild's tables, and logs the outcome once.
func (r *Rebuilder) finish(ctx context.Context, cur *run, b boost.Build, log *slog.Logger, err error) {
	st := cur.status(StateDone)
	if !cur.switched.Load() {
		st.State, st.Error = StateFailed, "the rebuild ended before its switch"
		if err != nil {
			st.Error = err.Error()
		}
		now := time.Now().UTC()
		st.FinishedAt = &now
		if saveErr := saveStatus(ctx, r.cfg.DB, st); saveErr != nil && !errors.Is(saveErr, errLeaseLost) {
			log.Error("rebuild outcome not saved", "error", saveErr.Error())
		}
	}
	if dropErr := b.Drop(ctx, r.cfg.DB); dropErr != nil {
		log.Warn("rebuild tables not dropped; the next rebuild drops them", "error", dropErr.Error())
	}
	if st.State == StateFailed {
		log.Error("projection rebuild failed", "phase", st.Phase, "error", st.Error)
		return
	}
	log.Info("projection rebuild done", "offsetsTotal", st.OffsetsTotal, "read", st.Read, "skipped", st.Skipped,
		"refused", st.Refused,
		"purchases", st.Purchases, "contributions", st.Contributions, "catchUps", st.CatchUps, "cardsChanged", st.CardsChanged,
		"tookMs", time.Since(cur.startedAt).Milliseconds())
}
