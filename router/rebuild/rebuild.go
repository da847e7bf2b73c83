// Package rebuild rebuilds the PromotionBoost projection: it resets the
// replica of contributions and every card's boost, then replays the purchase
// changelog from its earliest offset through the consumer chain. The
// per-purchase version guard makes the result deterministic whatever the
// order, and live consumption may go on meanwhile.
//
// Nothing is lost to a record the live consumer applies while the rebuild
// starts: the end offsets are read after the reset commits, so every record
// whose effect the reset wiped lies before them and is replayed, and every
// record applied after the reset keeps its effect and its dedup mark.
package rebuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/google/uuid"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/bounded"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// ErrRunning is a rebuild under way in this or another process.
var ErrRunning = errors.New("a projection rebuild is already running")

// Rebuilder runs projection rebuilds, one at a time across every process.
type Rebuilder struct {
	cfg Config

	mu  sync.Mutex
	cur *run // this process's rebuild, while it runs

	hooks hooks
}

// hooks are test seams; each runs, when set, at its point of a rebuild.
type hooks struct {
	// afterCheck runs after the topic check, before the reset.
	afterCheck func(context.Context) error
	// inReset runs inside the reset's transaction, after the reset and
	// before the commit, while the reset holds the projection's locks.
	inReset func(context.Context) error
	// beforeReplay runs after the end offsets were read.
	beforeReplay func(context.Context) error
}

type run struct {
	id       string
	progress bounded.Progress
	cancel   context.CancelCauseFunc
	done     chan struct{}
}

// New validates cfg (after defaults) and returns a Rebuilder.
func New(cfg Config) (*Rebuilder, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Rebuilder{cfg: cfg}, nil
}

// Status is the newest rebuild of any process; the one this process runs is
// read live.
func (r *Rebuilder) Status(ctx context.Context) (Status, error) {
	st, err := newest(ctx, r.cfg.DB, r.cfg.StaleAfter)
	if err != nil {
		return st, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil && r.cur.id == st.ID && st.State == StateRunning {
		c := r.cur.progress.Snapshot()
		st.OffsetsDone, st.OffsetsTotal, st.Read, st.Applied, st.Duplicates, st.Skipped = c.OffsetsDone, c.OffsetsTotal,
			c.Read, c.Replayed, c.Duplicates, c.Skipped
	}
	return st, nil
}

// Live is the progress of the rebuild this process runs, if any.
func (r *Rebuilder) Live() (bounded.Counts, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return bounded.Counts{}, false
	}
	return r.cur.progress.Snapshot(), true
}

// Start begins a rebuild that outlives ctx (a request) until it is done or
// Stop is called. It returns once the projection was reset, or with the error
// that stopped it before: ErrRunning, or an *IncompleteError when the topic
// cannot give back every purchase (nothing was reset then).
func (r *Rebuilder) Start(ctx context.Context) (Status, error) {
	started := make(chan error, 1)
	go func() { _ = r.execute(context.WithoutCancel(ctx), started) }()
	if err := <-started; err != nil {
		return Status{}, err
	}
	return r.Status(ctx)
}

// Run rebuilds and returns when the replay is done, failed, or ctx ended.
func (r *Rebuilder) Run(ctx context.Context) (Status, error) {
	err := r.execute(ctx, make(chan error, 1))
	st, stErr := r.Status(context.WithoutCancel(ctx))
	return st, errors.Join(err, stErr)
}

// Stop cancels the rebuild this process runs and waits for it to end.
func (r *Rebuilder) Stop() {
	r.mu.Lock()
	cur := r.cur
	r.mu.Unlock()
	if cur != nil {
		cur.cancel(nil)
		<-cur.done
	}
}

// execute runs one rebuild and reports on started once the reset committed,
// or the error that came first.
func (r *Rebuilder) execute(ctx context.Context, started chan<- error) (err error) {
	reported := false
	report := func(err error) {
		if !reported {
			reported = true
			started <- err
		}
	}
	defer func() { report(err) }()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	cur := &run{id: uuid.NewString(), cancel: cancel, done: make(chan struct{})}
	defer close(cur.done)
	now := time.Now().UTC()
	if err := acquire(ctx, r.cfg.DB, Status{ID: cur.id, StartedAt: &now}, r.cfg.StaleAfter); err != nil {
		return err
	}
	r.mu.Lock()
	r.cur = cur
	r.mu.Unlock()
	log := r.cfg.Log.With("rebuildId", cur.id)
	defer func() {
		r.mu.Lock()
		r.cur = nil
		r.mu.Unlock()
		if cause := context.Cause(ctx); errors.Is(cause, errLeaseLost) {
			err = cause
		}
		r.finish(context.WithoutCancel(ctx), cur, err)
	}()
	// From here on the progress writes renew the lease (lease.go).
	stopSaving := r.saveProgress(ctx, cur)
	defer stopSaving()

	client, err := bounded.Dial(r.cfg.Kafka, "promoflow-catalog-rebuild")
	if err != nil {
		return err
	}
	defer client.Close()
	if err := check(client, r.cfg.Topic); err != nil {
		return err
	}
	if err := r.hook(ctx, r.hooks.afterCheck); err != nil {
		return err
	}
	if err := r.reset(ctx); err != nil {
		return err
	}
	log.Info("projection reset, replaying", "topic", r.cfg.Topic)
	report(nil)

	// The ends are read only now, after the reset committed (see the package comment).
	parts, err := client.Partitions(r.cfg.Topic)
	if err != nil {
		return err
	}
	ranges := make([]bounded.Range, len(parts))
	for i, p := range parts {
		ranges[i] = p.Whole()
	}
	cur.progress.Plan(ranges)
	if err := r.hook(ctx, r.hooks.beforeReplay); err != nil {
		return err
	}
	return client.Read(ctx, ranges, r.apply(&cur.progress, log), &cur.progress)
}

func (r *Rebuilder) hook(ctx context.Context, h func(context.Context) error) error {
	if h == nil {
		return nil
	}
	return h(ctx)
}

// reset empties the projection and the consumer's dedup marks in one transaction.
func (r *Rebuilder) reset(ctx context.Context) error {
	tx, err := r.cfg.DB.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin reset: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	if err := boost.ResetTx(ctx, tx); err != nil {
		return err
	}
	if err := middleware.ResetDedupTx(ctx, tx, middleware.DedupKeyPrefixDefault); err != nil {
		return err
	}
	if err := r.hook(ctx, r.hooks.inReset); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit reset: %w", err)
	}
	return nil
}

// apply runs one record through the chain. A record that fails for good was
// dead-lettered once already: the rebuild counts it and goes on. A record the
// chain acks as a duplicate (the live consumer applied it after the reset) is
// counted apart from the applied ones.
func (r *Rebuilder) apply(p *bounded.Progress, log *slog.Logger) bounded.Handler {
	return func(ctx context.Context, rec *sarama.ConsumerMessage) error {
		p.Read.Add(1)
		p.Matched.Add(1)
		msg, err := kafka.DefaultMarshaler{}.Unmarshal(rec)
		if err != nil {
			return fmt.Errorf("unmarshal %s/%d@%d: %w", rec.Topic, rec.Partition, rec.Offset, err)
		}
		// The record's key, which the consumer checks against its PurchaseId.
		ctx, duplicate := middleware.WithDuplicateReport(kafkakit.WithKey(ctx, rec.Key))
		msg.SetContext(ctx)
		_, err = r.cfg.Chain(msg)
		var perm *middleware.Permanent
		switch {
		case errors.As(err, &perm):
			p.Skipped.Add(1)
			log.Warn("rebuild skipped a record", "topic", rec.Topic, "partition", rec.Partition,
				"offset", rec.Offset, "code", perm.Code, "reason", perm.Reason)
			return nil
		case err != nil:
			return fmt.Errorf("apply %s/%d@%d: %w", rec.Topic, rec.Partition, rec.Offset, err)
		case duplicate():
			p.Duplicates.Add(1)
		default:
			p.Replayed.Add(1)
		}
		return nil
	}
}

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
				err := saveStatus(ctx, r.cfg.DB, cur.id, StateRunning, cur.progress.Snapshot(), nil, "")
				switch {
				case errors.Is(err, errLeaseLost):
					// Another rebuild runs now: this one stops rather than race it.
					cur.cancel(err)
					return
				case err != nil && ctx.Err() == nil:
					r.cfg.Log.Warn("rebuild progress not saved", "rebuildId", cur.id, "error", err.Error())
				}
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// finish records the outcome and logs it once.
func (r *Rebuilder) finish(ctx context.Context, cur *run, err error) {
	c := cur.progress.Snapshot()
	state, errText := StateDone, ""
	if err != nil {
		state, errText = StateFailed, err.Error()
	}
	now := time.Now().UTC()
	if saveErr := saveStatus(ctx, r.cfg.DB, cur.id, state, c, &now, errText); saveErr != nil {
		r.cfg.Log.Error("rebuild outcome not saved", "rebuildId", cur.id, "error", saveErr.Error())
	}
	if err != nil {
		r.cfg.Log.Error("projection rebuild failed", "rebuildId", cur.id, "error", errText)
		return
	}
	r.cfg.Log.Info("projection rebuild done", "rebuildId", cur.id, "offsetsTotal", c.OffsetsTotal,
		"read", c.Read, "applied", c.Replayed, "duplicates", c.Duplicates, "skipped", c.Skipped)
}
