// Package nettest is a TCP proxy on 127.0.0.1, run inside a test process,
// between a client (a promoflow process, a component under test) and a
// server (a Kafka listener, PostgreSQL), that injects network faults: the
// fault suite's (scripts/faults) and the tests that cut a component off from
// its server. TestProxy_* show each mode does what they rely on.
package nettest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// Proxy forwards each connection it accepts to upstream, and injects one
// fault at a time into every connection, open or new:
//
//   - blackHole: nothing is forwarded in either direction and nothing is
//     closed. A connection accepted meanwhile is not dialed upstream. What
//     the peers send waits in the kernel's buffers, as it waits in a
//     sender's retransmission queue on a cut network, and flows on when the
//     hole heals, unless its sender reset the connection meanwhile: then
//     the proxy drops it, as the sender's reset would have emptied that
//     queue. This is the partition a process meets when a network drops its
//     packets: no error, no answer.
//   - latency: each chunk a server sends reaches its client that much later
//     (the downstream direction, as Toxiproxy's latency toxic), in order.
//   - reset: every connection is closed with a TCP reset on both sides, and
//     new ones are reset at once.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	hole    bool
	healed  chan struct{} // closed when the hole heals
	holes   int           // how many holes opened so far
	latency time.Duration
	reset   bool
	links   map[*link]bool
	closed  bool
	wg      sync.WaitGroup
	// forwarded counts the bytes delivered, both directions.
	forwarded int64
}

// link is one proxied connection; server is nil until it is dialed.
type link struct {
	client net.Conn
	holes  int // the proxy's hole count when it was accepted

	mu     sync.Mutex
	server net.Conn
}

func (l *link) upstream() net.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.server
}

// NewProxy listens on listen (127.0.0.1:0 for any port) and forwards to upstream.
func NewProxy(listen, upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("proxy for %s: %w", upstream, err)
	}
	p := &Proxy{ln: ln, upstream: upstream, links: map[*link]bool{}, healed: make(chan struct{})}
	close(p.healed)
	p.wg.Go(p.accept)
	return p, nil
}

func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// BlackHole starts a black hole: every read in flight is interrupted, so
// that nothing read after this moment is forwarded until heal.
func (p *Proxy) BlackHole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hole {
		return
	}
	p.hole = true
	p.holes++
	p.healed = make(chan struct{})
	for l := range p.links {
		_ = l.client.SetReadDeadline(time.Now())
		if s := l.upstream(); s != nil {
			_ = s.SetReadDeadline(time.Now())
		}
	}
}

// Heal ends a black hole: forwarding goes on where it stopped.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hole {
		p.hole = false
		close(p.healed)
	}
}

// SetLatency delays every chunk from the server by d from now on (0: none).
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// ResetAll resets every connection (and, while on, every new one).
func (p *Proxy) ResetAll(on bool) {
	p.mu.Lock()
	p.reset = on
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	if on {
		for _, l := range links {
			l.abort()
		}
	}
}

// Redirect sends every connection from now on to upstream, and resets every
// open one: a server that another one replaces at the same address, as a
// failover or a restore behind one DNS name or virtual IP does.
func (p *Proxy) Redirect(upstream string) {
	p.mu.Lock()
	p.upstream = upstream
	p.mu.Unlock()
	p.ResetAll(true)
	p.ResetAll(false)
}

// Bytes is how many bytes the proxy delivered so far.
func (p *Proxy) Bytes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.forwarded
}

// Close stops listening and resets every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	if p.hole {
		p.hole = false
		close(p.healed)
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.ResetAll(true)
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		l := &link{client: c, holes: p.holes}
		if p.closed || p.reset {
			p.mu.Unlock()
			l.abort()
			continue
		}
		p.links[l] = true
		p.mu.Unlock()
		p.wg.Go(func() { p.serve(l) })
	}
}

// serve dials upstream once no hole is open, then pumps both ways until
// either side ends.
func (p *Proxy) serve(l *link) {
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	if !p.waitHealed() {
		l.abort()
		return
	}
	p.mu.Lock()
	upstream := p.upstream
	p.mu.Unlock()
	server, err := net.DialTimeout("tcp", upstream, 5*time.Second)
	if err != nil {
		l.abort()
		return
	}
	p.mu.Lock()
	l.mu.Lock()
	l.server = server
	l.mu.Unlock()
	if p.hole { // a hole that opened while dialing
		_ = server.SetReadDeadline(time.Now())
	}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { p.pump(l, l.client, l.server, false) })
	wg.Go(func() { p.pump(l, l.server, l.client, true) })
	wg.Wait()
	_ = l.client.Close()
	_ = l.server.Close()
}

func (p *Proxy) holeCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.holes
}

// waitHealed waits until no hole is open; false when the proxy closed.
func (p *Proxy) waitHealed() bool {
	for {
		p.mu.Lock()
		hole, healed, closed := p.hole, p.healed, p.closed
		p.mu.Unlock()
		if closed {
			return false
		}
		if !hole {
			return true
		}
		<-healed
	}
}

// resetByPeer says whether the peer of c reset the connection. The kernel
// keeps what it received before a reset and hands it to the next read; on a
// real network those bytes would still have been in the sender's
// retransmission queue, which its reset dropped, so the proxy must drop them.
func resetByPeer(c net.Conn) bool {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return false
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	var soErr int
	_ = raw.Control(func(fd uintptr) {
		soErr, _ = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_ERROR)
	})
	return soErr != 0
}

// pump copies src to dst; downstream is the server's direction, which
// latency delays. A read that a hole interrupted resumes after heal; what a
// read returned is delivered, so a hole starts between two chunks.
func (p *Proxy) pump(l *link, src, dst net.Conn, downstream bool) {
	type chunk struct {
		data []byte
		due  time.Time
	}
	queue := make(chan chunk, 1024)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for c := range queue {
			time.Sleep(time.Until(c.due))
			if _, err := dst.Write(c.data); err != nil {
				l.abort()
				for range queue { // let the reader finish
				}
				return
			}
			p.mu.Lock()
			p.forwarded += int64(len(c.data))
			p.mu.Unlock()
		}
	}()
	defer func() {
		close(queue)
		<-writerDone
		// The sender is done: end the other peer's reading side.
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	// held waits out a hole; false when the link must end: the proxy closed,
	// or src was reset since a hole opened, which drops what it sent into
	// the hole (even when this pump only looks after the heal).
	seen := l.holes
	held := func() bool {
		ok := p.waitHealed()
		if now := p.holeCount(); ok && now != seen {
			seen = now
			if resetByPeer(src) {
				l.abort()
				return false
			}
		}
		return ok
	}
	buf := make([]byte, 32<<10)
	for {
		if !held() {
			return
		}
		_ = src.SetReadDeadline(time.Time{})
		p.mu.Lock()
		if p.hole { // reopened between the wait and clearing the deadline
			_ = src.SetReadDeadline(time.Now())
		}
		p.mu.Unlock()
		n, err := src.Read(buf)
		// A read may return bytes that arrived as a hole opened (the
		// deadline that interrupts it can lose that race): they wait for
		// Heal like those still in the kernel.
		if n > 0 && !held() {
			return
		}
		if n > 0 {
			p.mu.Lock()
			delay := p.latency
			p.mu.Unlock()
			if !downstream {
				delay = 0
			}
			queue <- chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(delay)}
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			// A hole opened: wait for heal at the top.
		case errors.Is(err, io.EOF):
			return
		default:
			// A reset (the kernel dropped what it held) or a closed link.
			l.abort()
			return
		}
	}
}

// abort closes both sides with a TCP reset.
func (l *link) abort() {
	for _, c := range []net.Conn{l.client, l.upstream()} {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
			_ = tc.Close()
		}
	}
}
