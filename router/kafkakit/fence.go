package kafkakit

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ErrFenced is a dial of a producer that was cut off (fencedDialer.abort).
var ErrFenced = errors.New("kafka producer cut off")

// fencedDialer dials the brokers for one producer, and can cut that producer
// off for good: abort resets every connection it made and refuses every
// later dial. A reset (SO_LINGER 0) makes the kernel drop what it has not
// delivered yet, instead of sending it after a graceful close; so once abort
// returns, no request of that producer, not even one a cut network would
// deliver late, can reach a broker. (A request a broker had already
// received is appended at once, before abort returns.)
//
// With a lease, a write while a Publish is under way (sending) and the lease
// has passed is refused, and aborts the dialer: so a process that lost the
// right to publish stops at its next write, however late its own goroutines
// notice. Between Publishes the client's own requests (metadata) go freely.
type fencedDialer struct {
	dialer net.Dialer
	lease  func() time.Time // nil: none

	sending      atomic.Int32 // Publishes under way
	leaseRefused atomic.Bool  // a write was refused past the lease

	mu      sync.Mutex
	conns   map[*fencedConn]bool
	aborted bool
}

func newFencedDialer(timeout, keepAlive time.Duration, lease func() time.Time) *fencedDialer {
	return &fencedDialer{dialer: net.Dialer{Timeout: timeout, KeepAlive: keepAlive}, lease: lease, conns: map[*fencedConn]bool{}}
}

// pastLease reports whether a write now would go out past the lease.
func (d *fencedDialer) pastLease() bool {
	return d.lease != nil && d.sending.Load() > 0 && !time.Now().Before(d.lease())
}

// Dial is the proxy.Dialer that Sarama's Net.Proxy takes.
func (d *fencedDialer) Dial(network, addr string) (net.Conn, error) {
	if d.isAborted() {
		return nil, ErrFenced
	}
	c, err := d.dialer.Dial(network, addr)
	if err != nil {
		return nil, err
	}
	fc := &fencedConn{Conn: c, d: d}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.aborted { // cut off while dialing
		reset(c)
		return nil, ErrFenced
	}
	d.conns[fc] = true
	return fc, nil
}

func (d *fencedDialer) isAborted() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.aborted
}

// abort resets every connection and refuses every later dial.
func (d *fencedDialer) abort() {
	d.mu.Lock()
	d.aborted = true
	conns := make([]*fencedConn, 0, len(d.conns))
	for c := range d.conns {
		conns = append(conns, c)
	}
	d.conns = map[*fencedConn]bool{}
	d.mu.Unlock()
	for _, c := range conns {
		reset(c.Conn)
	}
}

// reset closes c with a TCP reset.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// fencedConn is a connection its dialer keeps until it is closed.
type fencedConn struct {
	net.Conn
	d *fencedDialer
}

// Write refuses to write past the dialer's lease, and cuts the producer off.
func (c *fencedConn) Write(b []byte) (int, error) {
	if c.d.pastLease() {
		c.d.leaseRefused.Store(true)
		c.d.abort()
		return 0, ErrLeaseExpired
	}
	return c.Conn.Write(b)
}

func (c *fencedConn) Close() error {
	c.d.mu.Lock()
	delete(c.d.conns, c)
	c.d.mu.Unlock()
	return c.Conn.Close()
}
