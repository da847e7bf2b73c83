package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

// PositionGuard keeps a relay that may have lost the outbox position from
// publishing beside the process that took it over.
//
// The position is the offsets row that the relay's subscriber transaction
// locks (RelaySchema). When that transaction's session ends under it
// (pg_terminate_backend, a failover, a PgBouncer restart), PostgreSQL
// releases the lock at once and another process takes the position, while
// this one would go on publishing the page it holds, and two producers at
// once can interleave one purchase's records out of order. So:
//
//   - before each publish the guard checks the position's session, with a
//     round trip on its transaction, and checks it again every Lease/8 while
//     the publish runs;
//   - each check that succeeds lets the relay write to Kafka until Lease
//     after the check was sent (ValidUntil); the publisher refuses to write
//     past it and cuts its producer off (kafkakit.BatchPublisherConfig.Lease);
//   - a process that takes the position from a holder whose transaction did
//     not commit waits TakeoverWait, longer than Lease, before it reads
//     (RelaySchema).
//
// The old holder's last good check was sent before its session ended, and
// the new holder's wait begins after that: so nothing the old holder writes
// to Kafka lands after the new holder's first publish (docs/architecture.md,
// "The relay position").
//
// A check that fails rolls the transaction back, so that no ack of the page
// can commit, and acks the page's messages unpublished: the subscriber's ack
// then fails, and it reads the page again once it holds the position again.
type PositionGuard struct {
	cfg PositionGuardConfig

	mu    sync.Mutex
	lease *lease // the publish under way's; nil between publishes
}

// PositionGuardConfig configures a PositionGuard.
type PositionGuardConfig struct {
	// Lease is how long after a good check of the position's session the
	// relay may write to Kafka. Defaults to PositionLeaseDefault.
	Lease time.Duration
	// OnLost is told when a check fails, with its error. Optional.
	OnLost func(error)
}

// PositionLeaseDefault is the relay's lease: sixteen times the round trip
// of a check on a loaded server, and what a takeover waits, plus a quarter.
const PositionLeaseDefault = 2 * time.Second

// ErrPositionLost is a check of the position's session that failed.
var ErrPositionLost = errors.New("the relay's outbox position session is lost")

func (c *PositionGuardConfig) setDefaults() {
	c.Lease = cmp.Or(c.Lease, PositionLeaseDefault)
}

// Validate reports every out-of-range setting.
func (c PositionGuardConfig) Validate() error {
	c.setDefaults()
	if c.Lease <= 0 {
		return errors.New("relay position lease must be positive")
	}
	return nil
}

// TakeoverWait is how long a process that takes the position from a holder
// whose transaction did not commit waits before it reads: the lease, and a
// quarter of it for what the old holder's kernel still had to send when the
// lease ended and for the clocks' rates.
func (c PositionGuardConfig) TakeoverWait() time.Duration {
	c.setDefaults()
	return c.Lease + c.Lease/4
}

// IdleTimeout is how long the position's transaction may stay idle before
// PostgreSQL ends its session: twice the lease, far beyond the checks'
// Lease/8 while a publish runs, so that only a frozen process reaches it;
// never below minIdleTimeout.
func (c PositionGuardConfig) IdleTimeout() time.Duration {
	c.setDefaults()
	return max(2*c.Lease, minIdleTimeout)
}

// minIdleTimeout is room for the one idle wait of a healthy holder that is
// not bounded by the lease: watermill-sql's subscriber waits its
// ResendInterval (1 s) before it hands a nacked message over again.
const minIdleTimeout = 3 * time.Second

// NewPositionGuard returns a guard that holds no lease.
func NewPositionGuard(cfg PositionGuardConfig) (*PositionGuard, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &PositionGuard{cfg: cfg}, nil
}

// TakeoverWait is the config's TakeoverWait.
func (g *PositionGuard) TakeoverWait() time.Duration { return g.cfg.TakeoverWait() }

// IdleTimeout is the config's IdleTimeout.
func (g *PositionGuard) IdleTimeout() time.Duration { return g.cfg.IdleTimeout() }

// ValidUntil is the time until which the relay may write to Kafka: zero
// between publishes and once a check failed.
func (g *PositionGuard) ValidUntil() time.Time {
	g.mu.Lock()
	l := g.lease
	g.mu.Unlock()
	if l == nil {
		return time.Time{}
	}
	return l.validUntil()
}

// lease is one publish's: renewed by each good check, ended for good by a
// failed one or by the publish's end.
type lease struct {
	until atomic.Int64 // unix nanoseconds
	done  atomic.Bool
	lost  atomic.Pointer[error]
}

func (l *lease) validUntil() time.Time {
	if l.done.Load() {
		return time.Time{}
	}
	return time.Unix(0, l.until.Load())
}

// renew extends the lease to until.
func (l *lease) renew(until time.Time) {
	for cur := l.until.Load(); cur < until.UnixNano() && !l.done.Load(); cur = l.until.Load() {
		if l.until.CompareAndSwap(cur, until.UnixNano()) {
			return
		}
	}
}

// end ends the lease; err, when set, is why.
func (l *lease) end(err error) {
	if err != nil {
		l.lost.CompareAndSwap(nil, &err)
	}
	l.done.Store(true)
}

// Middleware checks the position's session before the relay's handler
// publishes a message and while it does, and grants the publisher its lease
// meanwhile. A message that does not come from the SQL subscriber (it has no
// transaction) is handled without a lease.
func (g *PositionGuard) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := wmsql.TxFromContext(msg.Context())
		if !ok {
			return h(msg)
		}
		l := &lease{}
		if err := g.check(msg.Context(), tx, l); err != nil {
			return g.lost(tx, err)
		}
		g.mu.Lock()
		g.lease = l
		g.mu.Unlock()
		stop := make(chan struct{})
		go g.watch(tx, l, stop)
		out, err := h(msg)
		close(stop)
		g.mu.Lock()
		g.lease = nil
		g.mu.Unlock()
		if lost := l.lost.Load(); lost != nil {
			return g.lost(tx, *lost)
		}
		l.end(nil)
		return out, err
	}
}

// watch checks the session every Lease/8 until stop is closed or a check fails.
func (g *PositionGuard) watch(tx *sql.Tx, l *lease, stop <-chan struct{}) {
	t := time.NewTicker(g.cfg.Lease / 8)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if err := g.check(context.Background(), tx, l); err != nil {
				return
			}
		}
	}
}

// check runs a round trip on tx, bounded by the lease, and renews l from
// the time it was sent; a failure ends l.
func (g *PositionGuard) check(ctx context.Context, tx *sql.Tx, l *lease) error {
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Lease)
	defer cancel()
	if _, err := tx.ExecContext(ctx, `SELECT 1`); err != nil {
		err = fmt.Errorf("%w: %w", ErrPositionLost, err)
		l.end(err)
		return err
	}
	l.renew(sent.Add(g.cfg.Lease))
	return nil
}

// lost rolls tx back, so that the page's ack cannot commit, and acks the
// message unpublished: the subscriber hands the page's other messages over
// at once (each fails its check), its ack fails, and it reads again.
func (g *PositionGuard) lost(tx *sql.Tx, err error) ([]*message.Message, error) {
	// Once per transaction: the page's other messages find it rolled back.
	if rbErr := tx.Rollback(); !errors.Is(rbErr, sql.ErrTxDone) && g.cfg.OnLost != nil {
		g.cfg.OnLost(err)
	}
	return nil, nil
}
