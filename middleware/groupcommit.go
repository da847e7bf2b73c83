package middleware

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Defaults of GroupCommitConfig.
const (
	GroupCommitMaxBatchDefault = 64
	GroupCommitWorkersDefault  = 2
	GroupCommitTimeoutDefault  = 30 * time.Second
	// GroupCommitMaxLocksDefault bounds the locks of one transaction. A
	// PostgreSQL server's shared lock table holds max_locks_per_transaction
	// (64) × about max_connections + 22 entries: about 7,800 on a default
	// server, 2,700 on one of 20 connections. 256 a transaction, 512 for the
	// two workers of a catalog process, leaves room for several processes and
	// every other session, and still lets 64 events of one or two targets
	// share a transaction.
	GroupCommitMaxLocksDefault = 256
)

// GroupCommitConfig configures GroupCommit.
type GroupCommitConfig struct {
	// DB runs the transactions. Required.
	DB *sqlx.DB
	// MaxBatch caps the messages of one transaction. Defaults to 64.
	MaxBatch int
	// Workers caps the transactions in flight at once. Defaults to 2.
	Workers int
	// Timeout bounds one transaction. Defaults to 30s.
	Timeout time.Duration
	// MaxLocks caps the locks the items of one transaction take together, as
	// NewGroupCommit's locks function counts them, so that a batch of wide items never fills the
	// server's shared lock table (53200 out of shared memory, for every
	// session of the cluster). An item that needs more than MaxLocks alone
	// goes alone. Defaults to 256.
	MaxLocks int
	// Dedup names and reports the dedup keys.
	Dedup DedupConfig
	// OnBatch, if set, is called after each transaction with its size (for a metric).
	OnBatch func(size int, took time.Duration)
	// Offsets, if set, stores each partition's next offset in every
	// transaction, with the effects of its records (offsets.go).
	Offsets *Offsets
}

// Validate reports every missing or out-of-range setting.
func (c GroupCommitConfig) Validate() error {
	c.setDefaults() // a copy: what the component will run with
	var errs []error
	if c.DB == nil {
		errs = append(errs, errors.New("group commit: a database is required"))
	}
	if c.MaxBatch < 1 || c.Workers < 1 || c.Timeout <= 0 || c.MaxLocks < 1 {
		errs = append(errs, errors.New("group commit: max batch, workers, timeout and max locks must be positive"))
	}
	return errors.Join(append(errs, c.Dedup.Validate())...)
}

func (c *GroupCommitConfig) setDefaults() {
	c.MaxBatch = cmp.Or(c.MaxBatch, GroupCommitMaxBatchDefault)
	c.Workers = cmp.Or(c.Workers, GroupCommitWorkersDefault)
	c.Timeout = cmp.Or(c.Timeout, GroupCommitTimeoutDefault)
	c.MaxLocks = cmp.Or(c.MaxLocks, GroupCommitMaxLocksDefault)
	c.Dedup.setDefaults()
}

// ApplyFunc applies items in tx and returns one result per item, in order.
// An error rolls back the whole transaction.
type ApplyFunc[T, R any] func(ctx context.Context, tx *sqlx.Tx, items []T) ([]R, error)

// GroupCommit is the consumer's unit of work with dedup. The messages that
// wait for it at the same time, from any partition, share one transaction:
// their dedup marks (dedup.go) are stored by one statement, the items of the
// marks that were new are applied by one ApplyFunc call, and all of it commits together
// before any of their handlers returns, so each message is acked only after
// its effect and its dedup mark committed (seed: replica, card boosts and
// dedup mark commit together, then the offset is acked). With
// GroupCommitConfig.Offsets, the same transaction stores, last, each
// partition's next offset that its messages move on (offsets.go).
//
// The subscriber's lanes keep a purchase's messages one after the other,
// so a transaction holds at most one message of each purchase of a topic,
// and, while one transaction runs, the next one fills; nor does it hold two
// messages of one MessageId. A message whose mark (its MessageId and its
// payload) is already stored is a duplicate: it is acked as a no-op; one of
// a MessageId stored with another payload is applied, and reported as
// reused. A concurrent duplicate waits on the mark's primary-key lock
// until the first delivery commits, then skips (or, if the first rolled back,
// applies). When a transaction of several messages fails, each is re-run in
// a transaction of its own, so that one message's error (a poison payload, a
// conflict) is its own and the others commit.
type GroupCommit[T, R any] struct {
	cfg   GroupCommitConfig
	apply ApplyFunc[T, R]
	locks func(T) int

	mu      sync.Mutex
	queue   []*waiter[T, R]
	running int
	// busy marks the worker slots in use, one per running lead: each
	// stores its offsets in rows of its own slot (offsets.go).
	busy []bool
}

// waiter is one message waiting for its transaction. It holds what the
// transaction needs of the message, taken when the waiter is made, and not
// the message itself: the message's handler can return (its context ended)
// while a transaction still runs with its item, and the chain above the
// handler then sets the message's context again.
type waiter[T, R any] struct {
	key    dedupKey
	serial string
	item   T
	locks  int
	// pos is the message's record, when a subscriber delivered it (hasPos).
	pos    Position
	hasPos bool
	// origin is the span of the message's handler, which the transaction's
	// span continues or links to.
	origin trace.SpanContext
	done   chan struct{}
	// Set before done closes.
	result      R
	dup, reused bool
	err         error
	// Guarded by GroupCommit.mu: gone is set when the message stopped
	// waiting before a transaction took it.
	gone bool
}

// NewGroupCommit checks cfg and returns a GroupCommit that applies items with
// apply. locks counts the locks that applying one item takes, which
// MaxLocks bounds per transaction (for the boost consumer: its purchase and
// each of its card targets, boost.Locks); nil counts one lock per item.
func NewGroupCommit[T, R any](cfg GroupCommitConfig, apply ApplyFunc[T, R], locks func(T) int) (*GroupCommit[T, R], error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if locks == nil {
		locks = func(T) int { return 1 }
	}
	return &GroupCommit[T, R]{cfg: cfg, apply: apply, locks: locks}, nil
}

// Do applies item for msg in the next transaction and waits for its commit.
// Items with equal serial never share a transaction and are taken in the
// order they came. dup is true when msg's dedup mark was stored already:
// nothing was applied. A message without a MessageId is deduplicated by
// its payload alone. When msg's context ends first, Do returns its error; a transaction
// that took the item may still commit it, and the redelivery is then a
// duplicate.
func (g *GroupCommit[T, R]) Do(msg *message.Message, serial string, item T) (result R, dup bool, err error) {
	w := &waiter[T, R]{key: g.cfg.Dedup.keyOf(msg), serial: serial, item: item,
		locks: g.locks(item), origin: trace.SpanContextFromContext(msg.Context()), done: make(chan struct{})}
	w.pos, w.hasPos = PositionOf(msg)
	g.mu.Lock()
	g.queue = append(g.queue, w)
	if g.running < g.cfg.Workers {
		g.running++
		go g.lead(g.takeSlot())
	}
	g.mu.Unlock()

	select {
	case <-w.done:
		if w.dup {
			// Here, in the handler's goroutine: only a message acked as a
			// duplicate is reported as one.
			g.cfg.Dedup.skipped(msg, w.key)
		}
		if w.reused {
			g.cfg.Dedup.reused(msg, w.key)
		}
		return w.result, w.dup, w.err
	case <-msg.Context().Done():
		g.mu.Lock()
		w.gone = true
		g.mu.Unlock()
		return result, false, fmt.Errorf("wait for unit of work: %w", msg.Context().Err())
	}
}

// Waiting is how many messages wait for a transaction to take them.
func (g *GroupCommit[T, R]) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, w := range g.queue {
		if !w.gone {
			n++
		}
	}
	return n
}

// takeSlot marks a free worker slot busy and returns it; g.mu is held, and
// fewer than Workers leads run.
func (g *GroupCommit[T, R]) takeSlot() int {
	if g.busy == nil {
		g.busy = make([]bool, g.cfg.Workers)
	}
	slot := slices.Index(g.busy, false)
	g.busy[slot] = true
	return slot
}

// lead runs transactions while messages wait, then ends.
func (g *GroupCommit[T, R]) lead(slot int) {
	for {
		g.mu.Lock()
		batch := g.take()
		if len(batch) == 0 {
			g.running--
			g.busy[slot] = false
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		g.run(batch, slot)
	}
}

// take removes from the queue, in order, up to MaxBatch waiters whose keys
// and serials differ and whose locks fit in MaxLocks together (the first
// waiter is taken whatever its locks); the others stay for a later
// transaction, and so does every later waiter of a serial left behind, so
// that a serial's items keep their order. g.mu is held.
func (g *GroupCommit[T, R]) take() []*waiter[T, R] {
	var batch, rest []*waiter[T, R]
	seen := map[string]bool{}
	locks := 0
	for _, w := range g.queue {
		fits := len(batch) == 0 || locks+w.locks <= g.cfg.MaxLocks
		switch {
		case w.gone:
		case len(batch) < g.cfg.MaxBatch && fits && !seen["k"+string(w.key.id)] && !seen["s"+w.serial]:
			seen["k"+string(w.key.id)], seen["s"+w.serial] = true, true
			batch, locks = append(batch, w), locks+w.locks
		default:
			seen["s"+w.serial] = true
			rest = append(rest, w)
		}
	}
	g.queue = rest
	return batch
}

// run commits batch, or each of its waiters alone when it fails, and
// releases them.
func (g *GroupCommit[T, R]) run(batch []*waiter[T, R], slot int) {
	start := time.Now()
	if err := g.commit(batch, slot); err != nil {
		if len(batch) == 1 {
			batch[0].err = err
		} else {
			for _, w := range batch {
				w.err = g.commit([]*waiter[T, R]{w}, slot)
			}
		}
	}
	if g.cfg.OnBatch != nil {
		g.cfg.OnBatch(len(batch), time.Since(start))
	}
	for _, w := range batch {
		close(w.done)
	}
}

// commit runs batch in one transaction and, once it committed, sets each
// waiter's result. Its span, catalog.promotion.store (the seed's span of a
// call to the store: one transaction, whatever the number of events),
// applies events of as many traces as waiters: it continues the one
// handler's process span of a batch of one, and links to each of a larger
// batch (StartBatchSpan).
func (g *GroupCommit[T, R]) commit(batch []*waiter[T, R], slot int) (err error) {
	origins := make([]trace.SpanContext, len(batch))
	for i, w := range batch {
		origins[i] = w.origin
	}
	ctx, span := StartBatchSpan("catalog.promotion.store", trace.SpanKindInternal, origins,
		semconv.MessagingBatchMessageCount(len(batch)), semconv.DBSystemNamePostgreSQL)
	defer func() {
		EndSpan(span, err)
		span.End()
	}()
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()
	tx, err := g.cfg.DB.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin unit of work: %w", err)
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("unit of work panicked: %v", p)
		}
		if err != nil {
			if rbErr := tx.Rollback(); rbErr != nil && !errors.Is(rbErr, sql.ErrTxDone) {
				err = errors.Join(err, fmt.Errorf("roll back unit of work: %w", rbErr))
			}
		}
	}()

	keys := make([]dedupKey, len(batch))
	for i, w := range batch {
		keys[i] = w.key
	}
	marks, err := storeMarks(ctx, tx, keys)
	if err != nil {
		return err
	}
	var fresh []*waiter[T, R]
	var items []T
	for i, w := range batch {
		if marks[i] != markDuplicate {
			fresh, items = append(fresh, w), append(items, w.item)
		}
	}
	var results []R
	if len(items) > 0 {
		if results, err = g.apply(ctx, tx, items); err != nil {
			return err
		}
		if len(results) != len(items) {
			return fmt.Errorf("unit of work: %d results for %d items", len(results), len(items))
		}
	}
	// Duplicates too: their records are done, and the offset moves past them.
	var positions []Position
	for _, w := range batch {
		if w.hasPos {
			positions = append(positions, w.pos)
		}
	}
	offsetsCommitted, err := g.cfg.Offsets.StoreTx(ctx, tx, slot, positions)
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit unit of work: %w", err)
	}
	offsetsCommitted()
	for i, w := range fresh {
		w.result = results[i]
	}
	for i, w := range batch {
		w.dup, w.reused = marks[i] == markDuplicate, marks[i] == markReused
	}
	return nil
}
