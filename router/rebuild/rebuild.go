// Package rebuild rebuilds the PromotionBoost projection blue/green: it builds
// a new replica of contributions, and every target's sum, beside the live
// projection from the compacted purchase topic, then switches to it in one
// short transaction. Readers see the live projection until the switch
// commits, and the consumer keeps applying events to it meanwhile.
//
// The phases, in order:
//
//   - read: record every partition's end offset, and copy the records up to
//     those ends into a staging table (boost.EventTable, by COPY), each
//     checked as the consumer checks it; a record that breaks the contract
//     is skipped and counted;
//   - load: the new replica from each purchase's latest event, in one
//     set-based statement (boost.Build.LoadTx);
//   - compute: every target's sum of active weights;
//   - catch-up: copy the records that arrived past the last ends and fold
//     them into the new replica and its sums with the consumer's version
//     guard, round after round until few arrive (Config.SwitchRecords);
//   - switch: one transaction holds the projection's writers back in the
//     global lock order (handlers/boost/lock.go), reads the final ends, folds
//     the last records in, gives every card whose boost changes its new value,
//     renames the new replica into place and records the rebuild done. Each
//     of its locks waits Config.SwitchWait at most: past it (a long reader
//     of the replica) the switch rolls back, lets the writers go on, catches
//     up and tries again.
//
// Nothing the live consumer applied is lost: the final ends are read while no
// writer of the projection can commit, so every event it committed lies below
// them and is in the new projection. Nothing is skipped either: the group's
// offsets and dedup marks stay as they are, so the consumer goes on from where
// it was; an event below the final ends that it reads after the switch finds
// its effect there already and is a no-op by the version guard, and one past
// them is applied to the new projection as usual.
//
// An interrupted rebuild (an error, Stop, or the process killed at any
// point) leaves the live projection as it was: only the switch writes it, in
// one transaction. Its tables are left behind, and the next rebuild drops
// them before it starts afresh.
package rebuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/bounded"
)

// ErrRunning is a rebuild under way in this or another process.
var ErrRunning = errors.New("a projection rebuild is already running")

// Rebuilder runs projection rebuilds, one at a time across every process.
type Rebuilder struct {
	cfg Config

	mu  sync.Mutex
	cur *run // this process's rebuild, while it runs

	// hook is a test seam, run at each point when set (export_test.go).
	hook func(context.Context, point) error
}

// point is a place in a rebuild where the test seam runs.
type point string

// The points of the test seam, in the order a rebuild reaches them.
const (
	// pointBeforeEnds: the topic checked, the ends not recorded yet.
	pointBeforeEnds point = "before-ends"
	// pointEnds: the ends recorded, no record read yet.
	pointEnds point = "ends"
	// pointRead: the first record of the read copied, the others being copied.
	pointRead point = "read"
	// pointLoad, pointCompute: their statements done, not committed.
	pointLoad    point = "load"
	pointCompute point = "compute"
	// pointCatchUp: a catch-up's ends read and its records copied, not folded.
	pointCatchUp point = "catch-up"
	// pointSwitchLocked: the switch holds the writers back and has not read
	// the final ends.
	pointSwitchLocked point = "switch-locked"
	// pointSwitch: the new replica renamed into place, not committed.
	pointSwitch point = "switch"
)

// run is one rebuild of this process.
type run struct {
	id                                               uuid.UUID
	startedAt                                        time.Time
	progress                                         bounded.Progress // offsets, records read and skipped, phase
	purchases, contributions, catchUps, cardsChanged atomic.Int64
	// switched is set once the switch committed: the rebuild is done
	// whatever follows.
	switched atomic.Bool
	cancel   context.CancelCauseFunc
	done     chan struct{}
}

// status is the run's state with its counts now.
func (c *run) status(state State) Status {
	p := c.progress.Snapshot()
	return Status{ID: c.id.String(), State: state, Phase: Phase(p.Phase), StartedAt: &c.startedAt,
		Counts: Counts{OffsetsDone: p.OffsetsDone, OffsetsTotal: p.OffsetsTotal, Read: p.Read, Skipped: p.Skipped,
			Purchases: c.purchases.Load(), Contributions: c.contributions.Load(), CatchUps: c.catchUps.Load(),
			CardsChanged: c.cardsChanged.Load()}}
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
	if r.cur != nil && r.cur.id.String() == st.ID && st.State == StateRunning {
		live := r.cur.status(StateRunning)
		st.Phase, st.Counts = live.Phase, live.Counts
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
// Stop is called. It returns once the rebuild began to read the topic, or with
// the error that stopped it before: ErrRunning, or an *IncompleteError when
// the topic cannot give back every purchase.
func (r *Rebuilder) Start(ctx context.Context) (Status, error) {
	started := make(chan error, 1)
	go func() { _ = r.execute(context.WithoutCancel(ctx), started) }()
	if err := <-started; err != nil {
		return Status{}, err
	}
	return r.Status(ctx)
}

// Run rebuilds and returns when the switch committed, the rebuild failed, or
// ctx ended.
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

// execute runs one rebuild and reports on started once it began to read the
// topic, or the error that came first.
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
	cur := &run{id: uuid.New(), startedAt: time.Now().UTC(), cancel: cancel, done: make(chan struct{})}
	defer close(cur.done)
	if err := acquire(ctx, r.cfg.DB, Status{ID: cur.id.String(), StartedAt: &cur.startedAt}, r.cfg.StaleAfter); err != nil {
		return err
	}
	r.mu.Lock()
	r.cur = cur
	r.mu.Unlock()
	log := r.cfg.Log.With("rebuildId", cur.id.String())
	b := boost.NewBuild(cur.id)
	defer func() {
		r.mu.Lock()
		r.cur = nil
		r.mu.Unlock()
		if cause := context.Cause(ctx); errors.Is(cause, errLeaseLost) && !cur.switched.Load() {
			err = cause
		}
		r.finish(context.WithoutCancel(ctx), cur, b, log, err)
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
	if err := r.prepare(ctx, b); err != nil {
		return err
	}
	report(nil)
	log.Info("projection rebuild started", "topic", r.cfg.Topic)
	return r.build(ctx, client, b, cur, log)
}

// prepare drops the tables that rebuilds left behind and creates the
// staging tables of b.
func (r *Rebuilder) prepare(ctx context.Context, b boost.Build) error {
	if err := boost.DropBuilds(ctx, r.cfg.DB); err != nil {
		return err
	}
	return r.inTx(ctx, "create staging tables", b.CreateTx)
}

// build runs the phases.
func (r *Rebuilder) build(ctx context.Context, client *bounded.Client, b boost.Build, cur *run, log *slog.Logger) error {
	ends, err := r.read(ctx, client, b, cur, log)
	if err != nil {
		return err
	}
	if err := r.phase(ctx, cur, log, PhaseLoad, func() error {
		return r.inTx(ctx, "load new replica", func(ctx context.Context, tx *sqlx.Tx) error {
			built, err := b.LoadTx(ctx, tx)
			cur.purchases.Store(built.Purchases)
			cur.contributions.Store(built.Contributions)
			return errors.Join(err, r.at(ctx, pointLoad))
		})
	}); err != nil {
		return err
	}
	if err := r.phase(ctx, cur, log, PhaseCompute, func() error {
		return r.inTx(ctx, "compute sums", func(ctx context.Context, tx *sqlx.Tx) error {
			_, err := b.ComputeTx(ctx, tx)
			return errors.Join(err, r.at(ctx, pointCompute))
		})
	}); err != nil {
		return err
	}
	if err := r.phase(ctx, cur, log, PhaseCatchUp, func() error {
		ends, err = r.catchUp(ctx, client, b, cur, log, ends)
		return err
	}); err != nil {
		return err
	}
	return r.phase(ctx, cur, log, PhaseSwitch, func() error { return r.switchGivingWay(ctx, client, b, cur, log, ends) })
}

// switchGivingWay runs the switch until it commits or fails for another
// reason than a lock it waited Config.SwitchWait for: then it lets the
// writers go on for as long, catches up and tries again.
func (r *Rebuilder) switchGivingWay(ctx context.Context, client *bounded.Client, b boost.Build, cur *run, log *slog.Logger,
	ends map[int32]int64) error {
	for {
		err := r.switchOver(ctx, client, b, cur, log, ends)
		if !lockTimedOut(err) {
			return err
		}
		log.Warn("the switch gave way: a lock it needs was held longer than the switch wait; the projection's writers go on, and the switch tries again",
			"switchWaitMs", r.cfg.SwitchWait.Milliseconds(), "holders", r.replicaHolders(ctx), "error", err)
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(r.cfg.SwitchWait):
		}
		if ends, err = r.catchUp(ctx, client, b, cur, log, ends); err != nil {
			return err
		}
	}
}

// lockTimedOut reports whether err is PostgreSQL's lock_timeout (55P03).
func lockTimedOut(err error) bool {
	var pqErr *pq.Error
	return errors.As(err, &pqErr) && pqErr.Code == pqerror.LockNotAvailable
}

// replicaHolders describes the other sessions that hold a lock on the live
// replica, for the log of a switch that gave way to them. Best effort: an
// error is described instead.
func (r *Rebuilder) replicaHolders(ctx context.Context) []string {
	var out []string
	err := r.cfg.DB.SelectContext(ctx, &out, `SELECT format('pid %s (%s), in a transaction for %s: %s', a.pid,
			coalesce(nullif(a.application_name, ''), 'no application name'), date_trunc('second', now() - a.xact_start), left(a.query, 120))
		FROM pg_stat_activity a
		WHERE a.pid <> pg_backend_pid() AND a.pid IN (
			SELECT l.pid FROM pg_locks l WHERE l.granted AND l.relation = 'catalog.promotion_contributions'::regclass)
		ORDER BY a.xact_start`)
	if err != nil {
		return []string{"not known: " + err.Error()}
	}
	return out
}

// phase runs one phase and logs its end with its duration.
func (r *Rebuilder) phase(ctx context.Context, cur *run, log *slog.Logger, p Phase, do func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	cur.progress.SetPhase(string(p))
	start := time.Now()
	if err := do(); err != nil {
		return fmt.Errorf("rebuild %s: %w", p, err)
	}
	st := cur.status(StateRunning)
	log.Info("rebuild phase done", "phase", p, "tookMs", time.Since(start).Milliseconds(), "read", st.Read,
		"skipped", st.Skipped, "purchases", st.Purchases, "contributions", st.Contributions, "catchUps", st.CatchUps,
		"cardsChanged", st.CardsChanged)
	return nil
}

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
		return r.inTx(ctx, "copy records", func(ctx context.Context, tx *sqlx.Tx) error {
			return r.copyTx(ctx, tx, client, b.Events, ranges, cur, log, pointRead)
		})
	})
	return ends, err
}

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
		if err := r.inTx(ctx, "fold catch-up", func(ctx context.Context, tx *sqlx.Tx) error {
			if err := r.copyTx(ctx, tx, client, b.Tail, ranges, cur, log, ""); err != nil {
				return err
			}
			if err := r.at(ctx, pointCatchUp); err != nil {
				return err
			}
			_, err := b.FoldTx(ctx, tx)
			return err
		}); err != nil {
			return nil, err
		}
		cur.catchUps.Add(1)
		ends = next
	}
}

// switchOver is the switch's one transaction (see the package comment).
func (r *Rebuilder) switchOver(ctx context.Context, client *bounded.Client, b boost.Build, cur *run, log *slog.Logger, ends map[int32]int64) error {
	return r.inTx(ctx, "switch", func(ctx context.Context, tx *sqlx.Tx) error {
		// Every lock of the switch waits SwitchWait at most: past it the
		// switch rolls back and the writers it held back go on.
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, r.cfg.SwitchWait.Milliseconds())); err != nil {
			return fmt.Errorf("set the switch's lock timeout: %w", err)
		}
		if err := boost.LockProjectionTx(ctx, tx); err != nil {
			return err
		}
		if err := r.at(ctx, pointSwitchLocked); err != nil {
			return err
		}
		// Read now, while no writer of the projection can commit: every
		// event the consumer committed lies below these ends.
		_, ranges, err := r.since(client, ends)
		if err != nil {
			return err
		}
		cur.progress.Extend(ranges)
		if err := r.copyTx(ctx, tx, client, b.Tail, ranges, cur, log, ""); err != nil {
			return err
		}
		if _, err := b.FoldTx(ctx, tx); err != nil {
			return err
		}
		cards, err := b.SwitchTx(ctx, tx)
		if err != nil {
			return err
		}
		cur.cardsChanged.Store(int64(cards))
		if err := r.at(ctx, pointSwitch); err != nil {
			return err
		}
		// Last, so that a rebuild whose lease was taken over switches nothing.
		done := cur.status(StateDone)
		now := time.Now().UTC()
		done.FinishedAt = &now
		return saveStatus(ctx, tx, done)
	}, func() { cur.switched.Store(true) })
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

// copyTx copies the records of ranges into t, in tx. The test seam at, when
// named, runs once the first record is copied.
func (r *Rebuilder) copyTx(ctx context.Context, tx *sqlx.Tx, client *bounded.Client, t boost.EventTable, ranges []bounded.Range,
	cur *run, log *slog.Logger, at point) error {
	loader, err := t.LoaderTx(ctx, tx, func(partition int32, offset int64, violation error) {
		cur.progress.Skipped.Add(1)
		code := middleware.CodeContractViolation
		if _, ok := errors.AsType[*event.KeyError](violation); ok {
			code = middleware.CodeKeyMismatch
		}
		log.Warn("rebuild skipped a record", "topic", r.cfg.Topic, "partition", partition, "offset", offset,
			"code", code, "reason", violation.Error())
	})
	if err != nil {
		return err
	}
	var seam sync.Once
	err = client.Read(ctx, ranges, func(ctx context.Context, rec *sarama.ConsumerMessage) error {
		cur.progress.Read.Add(1)
		if err := loader.Add(rec.Partition, rec.Offset, rec.Key, rec.Value); err != nil {
			return err
		}
		var err error
		if at != "" {
			seam.Do(func() { err = r.at(ctx, at) })
		}
		return err
	}, &cur.progress)
	return errors.Join(err, loader.Close())
}

// inTx runs do in a transaction and commits it; after, when given, runs once
// the commit succeeded.
func (r *Rebuilder) inTx(ctx context.Context, what string, do func(context.Context, *sqlx.Tx) error, after ...func()) error {
	tx, err := r.cfg.DB.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin %s: %w", what, err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	if err := do(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit %s: %w", what, err)
	}
	for _, f := range after {
		f()
	}
	return nil
}

func (r *Rebuilder) at(ctx context.Context, p point) error {
	if r.hook == nil {
		return nil
	}
	return r.hook(ctx, p)
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
		"purchases", st.Purchases, "contributions", st.Contributions, "catchUps", st.CatchUps, "cardsChanged", st.CardsChanged,
		"tookMs", time.Since(cur.startedAt).Milliseconds())
}
