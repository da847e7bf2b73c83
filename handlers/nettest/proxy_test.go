package nettest

import (
	"bufio"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// upstream is a line echo server that records every line it received.
type upstream struct {
	ln       net.Listener
	mu       sync.Mutex
	lines    []string
	accepted int
}

func newUpstream(t *testing.T) *upstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	u := &upstream{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.mu.Lock()
			u.accepted++
			u.mu.Unlock()
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					u.mu.Lock()
					u.lines = append(u.lines, line)
					u.mu.Unlock()
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return u
}

func (u *upstream) got() ([]string, int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.lines...), u.accepted
}

func startProxy(t *testing.T, u *upstream) *Proxy {
	p, err := NewProxy("127.0.0.1:0", u.ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

func dialLine(t *testing.T, p *Proxy) (net.Conn, *bufio.Reader) {
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c, bufio.NewReader(c)
}

func send(t *testing.T, c net.Conn, line string) {
	_, err := c.Write([]byte(line + "\n"))
	require.NoError(t, err)
}

// echoed sends a line and requires the upstream's echo of it.
func echoed(t *testing.T, c net.Conn, r *bufio.Reader, line string) {
	send(t, c, line)
	got, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, line+"\n", got)
}

// quietFor is how long a test watches that nothing gets through.
const quietFor = 500 * time.Millisecond

// TestProxy_BlackHoleForwardsNothingUntilHealThenEverything: in a hole a
// connection stays open and nothing crosses it, a new connection is accepted
// but not dialed upstream; after heal both go on, with what was sent
// meanwhile.
func TestProxy_BlackHoleForwardsNothingUntilHealThenEverything(t *testing.T) {
	t.Parallel()
	u := newUpstream(t)
	p := startProxy(t, u)
	c, r := dialLine(t, p)
	echoed(t, c, r, "before")

	p.BlackHole()
	send(t, c, "during")
	late, lateR := dialLine(t, p)
	send(t, late, "new")
	require.Never(t, func() bool { lines, accepted := u.got(); return len(lines) > 1 || accepted > 1 },
		quietFor, 10*time.Millisecond, "nothing crosses a black hole, and no connection is dialed through it: %v", fmt.Sprint(u.got()))

	p.Heal()
	for _, rd := range []*bufio.Reader{r, lateR} {
		line, err := rd.ReadString('\n')
		require.NoError(t, err)
		require.Contains(t, []string{"during\n", "new\n"}, line)
	}
	lines, accepted := u.got()
	require.ElementsMatch(t, []string{"before\n", "during\n", "new\n"}, lines)
	require.Equal(t, 2, accepted)
}

// TestProxy_WhatASenderResetsInAHoleNeverArrives: a client that resets its
// connection in a hole (as the relay aborts a publish) loses what it sent
// there, while one that closes it gracefully still delivers after heal, as
// TCP would retransmit it once the network is back.
func TestProxy_WhatASenderResetsInAHoleNeverArrives(t *testing.T) {
	t.Parallel()
	u := newUpstream(t)
	p := startProxy(t, u)
	// Several holes of several connections: what the kernel still holds and
	// what a pump had already read when a hole opened must both be dropped,
	// and which of the two happens depends on timing.
	const rounds, resets = 3, 10
	for round := range rounds {
		var resetting []net.Conn
		for range resets {
			c, _ := dialLine(t, p)
			send(t, c, "warm-up")
			resetting = append(resetting, c)
		}
		graceful, _ := dialLine(t, p)
		sent := (round + 1) * (resets + 1)
		require.Eventually(t, func() bool { lines, _ := u.got(); return len(lines) == sent-1 }, 10*time.Second, 10*time.Millisecond)

		p.BlackHole()
		for _, c := range resetting {
			send(t, c, "zombie")
		}
		send(t, graceful, "late")
		for _, c := range resetting {
			require.NoError(t, c.(*net.TCPConn).SetLinger(0))
			require.NoError(t, c.Close())
		}
		require.NoError(t, graceful.(*net.TCPConn).CloseWrite())
		p.Heal()

		require.Eventually(t, func() bool { lines, _ := u.got(); return len(lines) >= sent }, 10*time.Second, 10*time.Millisecond)
		require.Never(t, func() bool { lines, _ := u.got(); return len(lines) > sent }, quietFor, 10*time.Millisecond)
		lines, _ := u.got()
		require.NotContains(t, lines, "zombie\n", "round %d: the reset connections' bytes are dropped", round)
		require.Contains(t, lines, "late\n", "round %d: a gracefully closed connection's bytes arrive after the heal", round)
	}
}

// TestProxy_LatencyDelaysWhatTheServerSends: with latency on, an answer
// comes no sooner than the latency after its request.
func TestProxy_LatencyDelaysWhatTheServerSends(t *testing.T) {
	t.Parallel()
	u := newUpstream(t)
	p := startProxy(t, u)
	const latency = 200 * time.Millisecond
	p.SetLatency(latency)
	c, r := dialLine(t, p)
	for range 3 {
		start := time.Now()
		send(t, c, "ping")
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "ping\n", line)
		require.GreaterOrEqual(t, time.Since(start), latency, "an answer cannot beat the added latency")
	}
	require.Positive(t, p.Bytes())
}

// TestProxy_ResetEndsEveryConnectionAndRefusesNewOnes: a reset ends the
// open connections with an error and resets new ones until it is lifted.
func TestProxy_ResetEndsEveryConnectionAndRefusesNewOnes(t *testing.T) {
	t.Parallel()
	u := newUpstream(t)
	p := startProxy(t, u)
	c, r := dialLine(t, p)
	echoed(t, c, r, "one")

	p.ResetAll(true)
	_, err := r.ReadString('\n')
	require.Error(t, err, "an open connection ends")
	// On loopback the reset may even reach the connecting side first.
	if refused, err := net.Dial("tcp", p.Addr()); err == nil {
		defer refused.Close()
		_, _ = refused.Write([]byte("x\n"))
		_, err = bufio.NewReader(refused).ReadString('\n')
		require.Error(t, err, "a new connection is reset")
	}

	p.ResetAll(false)
	again, againR := dialLine(t, p)
	send(t, again, "two")
	line, err := againR.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "two\n", line)
}

// TestProxy_ResetByPeerTellsAResetFromAnOpenOrClosedConnection: the check
// the pumps make after a hole sees a peer's reset, even with the peer's
// last bytes still unread, and only a reset.
func TestProxy_ResetByPeerTellsAResetFromAnOpenOrClosedConnection(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	pair := func() (client, server net.Conn) {
		client, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		server, err = ln.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
		return client, server
	}
	open, openServer := pair()
	send(t, open, "still here")
	require.False(t, resetByPeer(openServer))

	reset, resetServer := pair()
	send(t, reset, "unread")
	require.NoError(t, reset.(*net.TCPConn).SetLinger(0))
	require.NoError(t, reset.Close())
	require.Eventually(t, func() bool { return resetByPeer(resetServer) }, 10*time.Second, 10*time.Millisecond)

	closed, closedServer := pair()
	send(t, closed, "last words")
	require.NoError(t, closed.Close())
	require.Never(t, func() bool { return resetByPeer(closedServer) }, quietFor, 10*time.Millisecond)
}

func TestProxy_RedirectResetsOpenConnectionsAndSendsNewOnesToTheNewServer(t *testing.T) {
	first, second := newUpstream(t), newUpstream(t)
	p := startProxy(t, first)
	c, r := dialLine(t, p)
	echoed(t, c, r, "one")

	p.Redirect(second.ln.Addr().String())
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := r.ReadString('\n')
	require.Error(t, err, "the open connection is reset")

	c2, r2 := dialLine(t, p)
	echoed(t, c2, r2, "two")
	lines, _ := second.got()
	require.Equal(t, []string{"two\n"}, lines, "a new connection reaches the new server")
	lines, _ = first.got()
	require.Equal(t, []string{"one\n"}, lines, "the old server gets nothing more")
}
