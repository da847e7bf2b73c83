package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/lib/pq"
)

// StandbyFlush keeps the relay from publishing what the standbys have not
// got: after an asynchronous failover, an event on Kafka whose change the
// promoted standby lacks is a phantom (a purchase that exists only on the
// topic, a boost that never ends).
//
// PostgreSQL keeps no commit LSN per row, so the relay bounds a page by the
// WAL insert position read after the page was selected: every row the page
// holds was committed, so its commit record was inserted, below it. Before
// the first message of a page goes to the publisher, the middleware polls
// pg_stat_replication until the configured standbys' flush_lsn reaches that
// position. Meanwhile the relay keeps its outbox position (its transaction
// stays open); once the message's ack deadline leaves less than a publish
// needs, it gives the page up unpublished, holds until that deadline ends the
// transaction, and reads the page again: a standby that never catches up
// stops the relay, it never makes it publish.
//
// The insert position, not pg_current_wal_lsn (the written one): a commit
// under synchronous_commit=off is visible before its record is written.
//
// flush_lsn is NULL to a role without pg_read_all_stats (or pg_monitor), so
// CheckGrant refuses that role at start. Nothing here begins or ends a
// transaction of the relay's.
type StandbyFlush struct {
	db  *sql.DB
	cfg StandbyFlushConfig

	mu     sync.Mutex
	held   bool
	lastTx *sql.Tx // the page whose bound the standbys have
}

// StandbyFlushConfig configures a StandbyFlush.
type StandbyFlushConfig struct {
	// Standbys are the standbys whose flush the relay waits for. Required:
	// its zero value (off) needs no StandbyFlush.
	Standbys Standbys
	// Poll is the time between reads of pg_stat_replication while the
	// relay waits. Defaults to StandbyFlushPollDefault.
	Poll time.Duration
	// PublishTimeout is the time a publish needs before the message's ack
	// deadline: the relay stops waiting and gives the page up when less is
	// left. Zero: it waits until the deadline.
	PublishTimeout time.Duration
	// MaxWait bounds the wait of a message that has no deadline (one that
	// does not come from the SQL subscriber). Defaults to StandbyFlushMaxWaitDefault.
	MaxWait time.Duration
	// OnHeld is told when the standbys first hold a page back (true, with
	// why) and when a page passes again (false, nil). Optional.
	OnHeld func(held bool, cause error)
	// OnWait is told how long each page waited for the standbys. Optional.
	OnWait func(time.Duration)
}

// Defaults of StandbyFlushConfig.
const (
	StandbyFlushPollDefault    = 5 * time.Millisecond
	StandbyFlushMaxWaitDefault = 2 * time.Second
)

// ErrStandbyBehind is what the relay's handler answers, without publishing,
// when the standbys have not flushed a page before its time ran out.
var ErrStandbyBehind = errors.New("the standbys have not flushed the outbox page")

// ErrStandbyStatsHidden is a relay role that cannot read the standbys'
// flush_lsn; the error names the grant.
var ErrStandbyStatsHidden = errors.New("the relay's database role cannot read pg_stat_replication.flush_lsn")

func (c *StandbyFlushConfig) setDefaults() {
	c.Poll = cmp.Or(c.Poll, StandbyFlushPollDefault)
	c.MaxWait = cmp.Or(c.MaxWait, StandbyFlushMaxWaitDefault)
}

// Validate reports every missing or out-of-range setting.
func (c StandbyFlushConfig) Validate() error {
	c.setDefaults()
	var errs []error
	if !c.Standbys.Enabled() {
		errs = append(errs, errors.New("standby flush needs a standby: any or their application_names"))
	}
	if c.Poll <= 0 || c.MaxWait <= 0 {
		errs = append(errs, errors.New("standby flush poll and max wait must be positive"))
	}
	if c.PublishTimeout < 0 {
		errs = append(errs, errors.New("standby flush publish timeout must not be negative"))
	}
	return errors.Join(errs...)
}

// NewStandbyFlush returns a StandbyFlush that reads the standbys' progress on db.
func NewStandbyFlush(db *sql.DB, cfg StandbyFlushConfig) (*StandbyFlush, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &StandbyFlush{db: db, cfg: cfg}, nil
}

// CheckGrant refuses a role that would read every flush_lsn as NULL, and so
// never see a standby catch up.
func (f *StandbyFlush) CheckGrant(ctx context.Context) error {
	var ok bool
	if err := f.db.QueryRowContext(ctx, `SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')`).Scan(&ok); err != nil {
		return fmt.Errorf("check the standby flush grant: %w", err)
	}
	if !ok {
		return fmt.Errorf("%w: GRANT pg_read_all_stats (or pg_monitor) TO the relay's role, or set RELAY_STANDBY_FLUSH=off", ErrStandbyStatsHidden)
	}
	return nil
}

// Middleware waits, before a page's first message goes on, until the
// standbys have flushed the WAL up to the position read after the page was
// selected; the page's later messages need no wait.
func (f *StandbyFlush) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := wmsql.TxFromContext(msg.Context())
		f.mu.Lock()
		flushed := tx != nil && tx == f.lastTx
		f.mu.Unlock()
		if flushed {
			return h(msg)
		}
		stop := keepBusy(tx)
		defer stop()
		if err := f.wait(msg.Context()); err != nil {
			if msg.Context().Err() != nil && !errors.Is(msg.Context().Err(), context.DeadlineExceeded) {
				return nil, err // a shutdown, not a standby behind
			}
			f.setHeld(true, err)
			if _, ok := msg.Context().Deadline(); ok {
				// Held to the deadline, so that the transaction ends and the
				// page is read again, with a new bound, at once.
				<-msg.Context().Done()
			}
			return nil, err
		}
		stop()
		f.mu.Lock()
		f.lastTx = tx
		f.mu.Unlock()
		f.setHeld(false, nil)
		return h(msg)
	}
}

// busyEvery is how often keepBusy runs a statement on the position's
// transaction: well within its idle limit (PositionGuardConfig.IdleTimeout,
// 3 s at least).
const busyEvery = time.Second

// keepBusy runs a statement on tx (nil: none) every busyEvery until the
// returned stop, which may be called more than once: the wait for the
// standbys, and the hold to the ack deadline after it, keep the position's
// transaction idle for longer than PostgreSQL's idle limit for it, which
// would end a healthy holder's session as it ends a frozen one's.
func keepBusy(tx *sql.Tx) (stop func()) {
	if tx == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(busyEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				// A failure is the session's end: the position guard finds
				// it before anything is published.
				if _, err := tx.Exec(`SELECT 1`); err != nil {
					return
				}
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// wait polls until the standbys have flushed the WAL insert position read
// now, or until the message must go to the publisher or be given up.
func (f *StandbyFlush) wait(ctx context.Context) error {
	start := time.Now()
	until, ok := ctx.Deadline()
	if ok {
		until = until.Add(-f.cfg.PublishTimeout)
	} else {
		until = start.Add(f.cfg.MaxWait)
	}
	var lsn string
	if err := f.db.QueryRowContext(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn); err != nil {
		return fmt.Errorf("%w: read the WAL position: %w", ErrStandbyBehind, err)
	}
	for {
		err := f.flushed(ctx, lsn)
		if err != nil {
			if nerr := f.nudge(ctx, lsn); nerr != nil {
				err = fmt.Errorf("%w; flush the WAL: %w", err, nerr)
			}
		}
		if err == nil {
			if f.cfg.OnWait != nil {
				f.cfg.OnWait(time.Since(start))
			}
			return nil
		}
		if time.Now().Add(f.cfg.Poll).After(until) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(f.cfg.Poll):
		}
	}
}

// nudge makes the primary flush its WAL up to lsn when it has not yet. The
// bound may hold records of transactions still running (the relay's own
// lock on its position, an outbox writer under way), which PostgreSQL
// flushes only with a later commit or a full page, and a standby receives
// only what its primary flushed: on an idle server the wait would never
// end. The commit of a transaction that took an id flushes every record
// before its own; synchronous_commit=local, so that it waits for no standby.
func (f *StandbyFlush) nudge(ctx context.Context, lsn string) error {
	var behind bool
	if err := f.db.QueryRowContext(ctx, `SELECT pg_current_wal_flush_lsn() < $1::pg_lsn`, lsn).Scan(&behind); err != nil || !behind {
		return err
	}
	tx, err := f.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SET LOCAL synchronous_commit = local`); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `SELECT pg_current_xact_id()`); err != nil {
		return err
	}
	return tx.Commit()
}

// flushed is nil once the configured standbys have flushed lsn. Only
// physical standbys count: a logical walsender (a CDC tool) is connected to a
// database, and its flush says nothing of what a failover keeps.
func (f *StandbyFlush) flushed(ctx context.Context, lsn string) error {
	var got []string
	err := f.db.QueryRowContext(ctx, `SELECT coalesce(array_agg(DISTINCT r.application_name), '{}')
		FROM pg_stat_replication r JOIN pg_stat_activity a ON a.pid = r.pid
		WHERE coalesce(a.datid, 0) = 0 AND r.flush_lsn >= $1::pg_lsn
			AND ($2 OR r.application_name = ANY($3::text[]))`,
		lsn, f.cfg.Standbys.Any, pq.Array(f.cfg.Standbys.Names)).Scan(pq.Array(&got))
	if err != nil {
		return fmt.Errorf("%w: read pg_stat_replication: %w", ErrStandbyBehind, err)
	}
	if f.cfg.Standbys.Any {
		if len(got) == 0 {
			return fmt.Errorf("%w: no standby has flushed %s", ErrStandbyBehind, lsn)
		}
		return nil
	}
	var behind []string
	for _, name := range f.cfg.Standbys.Names {
		if !slices.Contains(got, name) {
			behind = append(behind, name)
		}
	}
	if len(behind) > 0 {
		return fmt.Errorf("%w: %s not flushed to %s", ErrStandbyBehind, strings.Join(behind, ", "), lsn)
	}
	return nil
}

// setHeld tells OnHeld of a change only.
func (f *StandbyFlush) setHeld(held bool, cause error) {
	f.mu.Lock()
	changed := f.held != held
	f.held = held
	f.mu.Unlock()
	if changed && f.cfg.OnHeld != nil {
		f.cfg.OnHeld(held, cause)
	}
}

// Standbys names the standbys whose flush the relay waits for: none (off),
// any one, or each of the named ones (their application_name in
// pg_stat_replication). As a flag value it reads "off", "any" or
// "name1,name2".
type Standbys struct {
	// Any is at least one standby, whichever.
	Any bool
	// Names are the standbys that must all have flushed.
	Names []string
}

// Enabled reports whether the relay waits for a standby.
func (s Standbys) Enabled() bool { return s.Any || len(s.Names) > 0 }

// String is the flag form of s.
func (s Standbys) String() string {
	switch {
	case s.Any:
		return "any"
	case len(s.Names) > 0:
		return strings.Join(s.Names, ",")
	}
	return "off"
}

// Set parses the flag form: off, any, or application_names separated by commas.
func (s *Standbys) Set(v string) error {
	*s = Standbys{}
	switch v = strings.TrimSpace(v); v {
	case "", "off":
		return nil
	case "any":
		s.Any = true
		return nil
	}
	for _, name := range strings.Split(v, ",") {
		name = strings.TrimSpace(name)
		if name == "" || name == "any" || name == "off" {
			return fmt.Errorf("standby list %q: want off, any, or application_names separated by commas", v)
		}
		s.Names = append(s.Names, name)
	}
	return nil
}
