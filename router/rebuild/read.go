package rebuild

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/IBM/sarama"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/bounded"
)

// The read phase: the ends recorded, and the records up to them copied into
// the staging table of events.

// read records the ends and copies the records up to them; it returns the
// ends.
func (r *Rebuilder) read(ctx context.Context, client *bounded.Client, b boost.Build, cur *run, log *slog.Logger) (ends map[int32]int64, err error) {
	err = r.phase(ctx, cur, log, PhaseRead, func() error {
		if err := r.at(ctx, pointBeforeEnds); err != nil {
			return err
		}
		var ranges []bounded.Range
		if ends, ranges, err = r.since(client, nil); err != nil {
			return err
		}
		cur.progress.Plan(ranges)
		if err := r.at(ctx, pointEnds); err != nil {
			return err
		}
		copied, err := r.copy(ctx, client, b.Events, ranges, cur, log, pointRead)
		if err != nil {
			return err
		}
		cur.staged.Events, err = b.SealEvents(ctx, r.cfg.DB, copied)
		return err
	})
	return ends, err
}

// since reads every partition's ends now, and returns them with the ranges
// from ends (a partition ends does not name: from its oldest offset) up to
// them, empty ranges left out.
func (r *Rebuilder) since(client *bounded.Client, ends map[int32]int64) (map[int32]int64, []bounded.Range, error) {
	parts, err := client.Partitions(r.cfg.Topic)
	if err != nil {
		return nil, nil, err
	}
	next := make(map[int32]int64, len(parts))
	var ranges []bounded.Range
	for _, p := range parts {
		from, ok := ends[p.Partition]
		if !ok {
			from = p.Oldest
		}
		next[p.Partition] = max(from, p.Newest)
		if p.Newest > from {
			ranges = append(ranges, bounded.Range{Topic: p.Topic, Partition: p.Partition, From: from, End: p.Newest})
		}
	}
	return next, ranges, nil
}

func records(ranges []bounded.Range) int64 {
	var n int64
	for _, rg := range ranges {
		n += rg.Len()
	}
	return n
}

// copy copies the records of ranges into t, a chunk per transaction, and
// returns how many rows it committed. The test seam at, when named, runs
// once the first chunk committed.
func (r *Rebuilder) copy(ctx context.Context, client *bounded.Client, t boost.EventTable, ranges []bounded.Range,
	cur *run, log *slog.Logger, at point) (int64, error) {
	var seam sync.Once
	loader, err := t.NewLoader(ctx, boost.LoaderConfig{DB: r.cfg.DB,
		Skipped: func(partition int32, offset int64, violation error) {
			cur.progress.Skipped.Add(1)
			code := middleware.CodeContractViolation
			if _, ok := errors.AsType[*event.KeyError](violation); ok {
				code = middleware.CodeKeyMismatch
			}
			log.Warn("rebuild skipped a record", "topic", r.cfg.Topic, "partition", partition, "offset", offset,
				"code", code, "reason", violation.Error())
		},
		Refused: func(rf boost.Refused) {
			cur.refused.add(rf)
			log.Warn("rebuild skipped a record PostgreSQL refused", "topic", r.cfg.Topic, "partition", rf.Partition,
				"offset", rf.Offset, "code", rf.Code, "reason", rf.Reason)
		},
		Check: r.check,
		Committed: func(ctx context.Context, _ int64) error {
			var err error
			if at != "" {
				seam.Do(func() { err = r.at(ctx, at) })
			}
			return err
		}})
	if err != nil {
		return 0, err
	}
	err = client.Read(ctx, ranges, func(_ context.Context, rec *sarama.ConsumerMessage) error {
		cur.progress.Read.Add(1)
		return loader.Add(rec.Partition, rec.Offset, rec.Key, rec.Value)
	}, &cur.progress)
	err = errors.Join(err, loader.Close())
	return loader.Rows(), err
}
