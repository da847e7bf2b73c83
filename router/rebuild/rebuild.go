// Package rebuild rebuilds the PromotionBoost projection blue/green: it builds
// a new replica of contributions, and every target's sum, beside the live
// projection from the compacted purchase topic, then switches to it in one
// short transaction. Readers see the live projection until the switch
// commits, and the consumer keeps applying events to it meanwhile.
//
// The phases, in order, each in the file named for it (read.go, load.go,
// compute.go, catchup.go, switch.go; rebuild.go runs them, progress.go writes
// the progress and the outcome, lease.go holds one rebuild at a time):
//
//   - read: record every partition's end offset, and copy the records up to
//     those ends into a staging table (boost.EventTable, by COPY in chunks,
//     each a short transaction of its own: boost.Copier), each checked as
//     the consumer checks it; a record that breaks the contract is skipped
//     and counted, and so is one whose row PostgreSQL refuses;
//   - load: the new replica, and every target's sum of active weights, from
//     each purchase's latest event, a slice of purchases per transaction
//     (boost.Build.LoadSliceTx; Config.LoadSlice records a slice);
//   - compute: the new tables' statistics;
//   - catch-up: copy the records that arrived past the last ends and fold
//     them into the new replica and its sums with the consumer's version
//     guard, round after round until few arrive (Config.SwitchRecords);
//   - switch: one transaction holds migrations back (sqlmigrate), then the
//     projection's writers in the global lock order
//     (handlers/boost/lock.go), reads the final ends, folds the last records
//     in, gives every card whose boost changes its new value, renames the
//     new replica into place once it matches the live one (and carries its
//     grants and storage options: handlers/boost/carry.go) and records the
//     rebuild done.
//
// The switch is bounded: each of its locks waits Config.SwitchWait at most,
// each statement runs Config.SwitchStatementTimeout at most, each pause
// between two lasts Config.SwitchIdleTimeout at most (past it PostgreSQL
// ends the session, and its locks, of a rebuild cut off from it), and it
// folds Config.SwitchMaxRecords at most. Past any of them it rolls back (it
// gives way), lets the writers go on, catches up and tries again; the
// records it read stay in the tail, so none is read or counted twice.
//
// No transaction of a rebuild holds an xid for long (every promotion relay of
// the server waits for the oldest one): the read and the catch-ups commit a
// chunk at a time, the load a slice at a time, and the switch is bounded.
//
// Nothing the live consumer applied is lost: the final ends are read while no
// writer of the projection can commit, so every event it committed lies below
// them and is in the new projection. Nothing is skipped either: the group's
// offsets, the consumer's offsets stored with the projection
// (catalog.consumer_offsets, each written by a committed consumer
// transaction, so at most the final ends) and the dedup marks stay as they
// are, so the consumer goes on from where it was; an event below the final ends that it reads after the switch finds
// its effect there already and is a no-op by the version guard, and one past
// them is applied to the new projection as usual.
//
// An interrupted rebuild (an error, Stop, or the process killed at any
// point) leaves the live projection as it was: only the switch writes it, in
// one transaction. Its tables are left behind, and the next rebuild drops
// them before it starts afresh. A crash recovery or a failover empties the
// unlogged ones while the rebuild goes on: the rebuild counts what it wrote
// to them and every step checks the table it reads (boost.Staged), so such a
// rebuild fails rather than switch in what is left.
package rebuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
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
	// check parses and checks each record read (boost.LoaderConfig.Check);
	// nil: as the consumer does. A test seam (export_test.go).
	check func(key, value []byte) (event.PurchaseChanged, error)
}

// point is a place in a rebuild where the test seam runs.
type point string

// The points of the test seam, in the order a rebuild reaches them.
const (
	// pointBeforeEnds: the topic checked, the ends not recorded yet.
	pointBeforeEnds point = "before-ends"
	// pointEnds: the ends recorded, no record read yet.
	pointEnds point = "ends"
	// pointRead: the first chunk of the read committed, the others being
	// read.
	pointRead point = "read"
	// pointLoad: the first slice of the new replica committed, the others
	// not loaded yet.
	pointLoad point = "load"
	// pointCompute: the compute committed, the catch-up not begun.
	pointCompute point = "compute"
	// pointCatchUp: a catch-up's ends read and its records copied (and
	// committed), not folded.
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
	refused                                          refusals
	// staged is what the rebuild wrote to its unlogged tables, checked
	// before each use (boost.Staged); only the rebuild's goroutine uses it.
	staged boost.Staged
	// switched is set once the switch committed: the rebuild is done
	// whatever follows.
	switched atomic.Bool
	cancel   context.CancelCauseFunc
	done     chan struct{}
}

// status is the run's state with its counts now.
func (c *run) status(state State) Status {
	p := c.progress.Snapshot()
	refused, shown := c.refused.snapshot()
	return Status{ID: c.id.String(), State: state, Phase: Phase(p.Phase), StartedAt: &c.startedAt, RefusedRecords: shown,
		Counts: Counts{OffsetsDone: p.OffsetsDone, OffsetsTotal: p.OffsetsTotal, Read: p.Read, Skipped: p.Skipped,
			Refused: refused, Purchases: c.purchases.Load(), Contributions: c.contributions.Load(),
			CatchUps: c.catchUps.Load(), CardsChanged: c.cardsChanged.Load()}}
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
	if err := acquire(ctx, r.cfg.DB, Status{ID: cur.id.String(), StartedAt: &cur.startedAt}, r.cfg.StaleAfter, r.cfg.Cooldown); err != nil {
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
	if b, err = r.prepare(ctx, client, b); err != nil {
		return err
	}
	report(nil)
	log.Info("projection rebuild started", "topic", r.cfg.Topic)
	return r.build(ctx, client, b, cur, log)
}

// prepare drops the tables that rebuilds left behind and creates the
// staging tables of b, its events in as many slices as the topic's records
// now need (Config.LoadSlice), and returns b so sliced.
func (r *Rebuilder) prepare(ctx context.Context, client *bounded.Client, b boost.Build) (boost.Build, error) {
	if err := boost.DropBuilds(ctx, r.cfg.DB); err != nil {
		return b, err
	}
	_, ranges, err := r.since(client, nil)
	if err != nil {
		return b, err
	}
	b = b.Sliced(slices(records(ranges), r.cfg.LoadSlice))
	return b, r.inTx(ctx, "create staging tables", b.CreateTx)
}

// build runs the phases.
func (r *Rebuilder) build(ctx context.Context, client *bounded.Client, b boost.Build, cur *run, log *slog.Logger) error {
	ends, err := r.read(ctx, client, b, cur, log)
	if err != nil {
		return err
	}
	if err := r.phase(ctx, cur, log, PhaseLoad, func() error { return r.load(ctx, b, cur) }); err != nil {
		return err
	}
	if err := r.phase(ctx, cur, log, PhaseCompute, func() error { return r.compute(ctx, b, cur) }); err != nil {
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

// phase runs one phase and logs its end with its duration.
func (r *Rebuilder) phase(ctx context.Context, cur *run, log *slog.Logger, p Phase, do func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	cur.progress.SetPhase(string(p))
	start := time.Now()
	if err := do(); err != nil {
		if boost.IsLost(err) {
			return fmt.Errorf("rebuild %s: %w; nothing was switched in, the live projection is as it was: run the rebuild again", p, err)
		}
		return fmt.Errorf("rebuild %s: %w", p, err)
	}
	st := cur.status(StateRunning)
	log.Info("rebuild phase done", "phase", p, "tookMs", time.Since(start).Milliseconds(), "read", st.Read,
		"skipped", st.Skipped, "refused", st.Refused, "purchases", st.Purchases, "contributions", st.Contributions, "catchUps", st.CatchUps,
		"cardsChanged", st.CardsChanged)
	return nil
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
