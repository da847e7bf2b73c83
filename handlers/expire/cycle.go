package expire

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/purchase"
)

// RunCycle takes batches until the backlog is drained or MaxDuration is spent.
// An infrastructure error rolls back the batch under way and ends the cycle
// (batches committed before it stay); the next cycle retries. A cancelled ctx
// stops the cycle between batches and is not an error.
func (e *Expirer) RunCycle(ctx context.Context) (res Result, err error) {
	start := time.Now()
	res = Result{RunID: uuid.NewString()}
	// The run id is the correlation id of the cycle span and of every event
	// the cycle emits, so a trace joins them.
	ctx, span := tracer.Start(ctx, "promotion.expire.cycle", trace.WithAttributes(attribute.String("correlation_id", res.RunID)))
	defer func() {
		span.SetAttributes(attribute.Int("expired_count", res.ExpiredCount), attribute.Int("poison_count", res.PoisonCount),
			attribute.Int("skipped_locked_count", res.SkippedLockedCount), attribute.Int("batches", res.Batches))
		endSpan(span, err)
	}()
	log := e.log.With("runId", res.RunID)
	// Read even when shutdown has begun, as a batch would be: the loop below
	// then stops the cycle, which is not an error.
	clockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.BatchTimeout)
	res.AsOf, err = databaseNow(clockCtx, e.db)
	cancel()
	if err != nil {
		res.Duration = time.Since(start)
		return res, err
	}
	span.SetAttributes(attribute.String("as_of", res.AsOf.Format(time.RFC3339Nano)))
	log.Info("cycle started", "AsOf", res.AsOf, "clockSkew", e.Now().Sub(res.AsOf).Round(time.Millisecond).String())

	scan := newDueScan()
	drained, err := e.batches(ctx, log, &res, scan, start)
	if err != nil {
		res.Duration = time.Since(start)
		return res, err
	}

	if !res.Interrupted {
		// A shutdown that lands here must not turn the finished cycle into an error.
		countCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.BatchTimeout)
		defer cancel()
		if err := e.countLeft(countCtx, &res, scan.poisonIDs(), drained); err != nil {
			res.Duration = time.Since(start)
			return res, err
		}
	}
	res.Duration = time.Since(start)
	log.Info("cycle completed", "ExpiredCount", res.ExpiredCount, "poisonCount", res.PoisonCount,
		"SkippedLockedCount", res.SkippedLockedCount, "backlog", res.Backlog, "batches", res.Batches,
		"DurationMs", res.Duration.Milliseconds(), "interrupted", res.Interrupted, "cut", res.Cut)
	return res, nil
}

// batches runs the cycle's batches until one comes back short of BatchSize
// (drained), MaxDuration is spent (Cut; the first batch runs whatever the
// time the cycle's start took), ctx ends (Interrupted) or one fails.
// The first full batch shows a backlog, and from then on Concurrency
// transactions run at once: they take disjoint rows (SKIP LOCKED), so one's
// Go work and round trips overlap another's SQL. A batch under way when
// another stops the cycle runs on to commit or roll back whole.
func (e *Expirer) batches(ctx context.Context, log *slog.Logger, res *Result, scan *dueScan, start time.Time) (bool, error) {
	var (
		mu                              sync.Mutex
		stop, drained, cut, interrupted bool
		firstErr                        error
		wg                              sync.WaitGroup
		workers, begun                  int
		cycle                           = Result{RunID: res.RunID, AsOf: res.AsOf}
	)
	var work func()
	spawn := func() { // mu held
		workers++
		wg.Go(work)
	}
	work = func() {
		for {
			mu.Lock()
			switch {
			case stop:
			case begun > 0 && time.Since(start) >= e.cfg.MaxDuration: // a cycle takes one batch at least
				cut, stop = true, true
			case ctx.Err() != nil:
				interrupted, stop = true, true
			}
			if stop {
				mu.Unlock()
				return
			}
			begun++
			mu.Unlock()
			b, err := e.batch(ctx, log, cycle, scan)
			mu.Lock()
			switch {
			case err != nil:
				firstErr = cmp.Or(firstErr, err)
				stop = true
			default:
				res.Batches++
				res.ExpiredCount += b.expired
				res.PoisonCount += b.poison
				res.Delays = append(res.Delays, b.delays...)
				if b.selected < e.cfg.BatchSize {
					drained, stop = true, true
				} else if workers < e.cfg.Concurrency {
					spawn()
				}
			}
			mu.Unlock()
		}
	}
	mu.Lock()
	spawn()
	mu.Unlock()
	wg.Wait()
	if firstErr != nil {
		return false, firstErr
	}
	res.Cut = cut && !drained
	res.Interrupted = interrupted && !drained
	return drained, nil
}

// countLeft sets Backlog and, when the cycle drained every row it could lock,
// SkippedLockedCount: the due rows still Active that are not poison are held
// by another instance or an in-flight cancel.
func (e *Expirer) countLeft(ctx context.Context, res *Result, poison []uuid.UUID, drained bool) error {
	all, healthy, err := purchase.CountDue(ctx, e.db, res.AsOf, poison)
	if err != nil {
		return err
	}
	res.Backlog = all
	if drained {
		res.SkippedLockedCount = healthy
	}
	return nil
}

func keys(m map[uuid.UUID]bool) []uuid.UUID {
	out := make([]uuid.UUID, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	return out
}

// endSpan records err, if any, on span and ends it.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
