package kafkakit

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFencedDialer_AbortResetsEveryConnectionAndRefusesNewOnes: once a
// producer is cut off, its open connections end with a reset (what the
// kernel had not delivered is dropped, not sent after a graceful close)
// and it can dial no broker again.
func TestFencedDialer_AbortResetsEveryConnectionAndRefusesNewOnes(t *testing.T) {
	t.Parallel()
	ln, accepted := listen(t)
	d := newFencedDialer(time.Second, 0, nil)
	c, err := d.Dial("tcp", ln)
	require.NoError(t, err)
	server := <-accepted
	t.Cleanup(func() { _ = server.Close() })
	_, err = c.Write([]byte("x"))
	require.NoError(t, err)
	buf := make([]byte, 1)
	_, err = server.Read(buf)
	require.NoError(t, err)

	d.abort()
	_, err = server.Read(buf)
	require.True(t, errors.Is(err, syscall.ECONNRESET), "the broker's side sees a reset, not an orderly close: %v", err)
	_, err = d.Dial("tcp", ln)
	require.ErrorIs(t, err, ErrFenced)
}

// TestFencedDialer_AWritePastTheLeaseIsRefusedAndCutsTheProducerOff: while
// a Publish is under way, a write past the lease never reaches the socket,
// and the dialer is cut off; between Publishes the client's own requests go.
func TestFencedDialer_AWritePastTheLeaseIsRefusedAndCutsTheProducerOff(t *testing.T) {
	t.Parallel()
	ln, accepted := listen(t)
	past := func() time.Time { return time.Now().Add(-time.Millisecond) }
	d := newFencedDialer(time.Second, 0, past)
	c, err := d.Dial("tcp", ln)
	require.NoError(t, err)
	server := <-accepted
	t.Cleanup(func() { _ = server.Close() })
	_, err = c.Write([]byte("m"))
	require.NoError(t, err, "no Publish under way: the lease does not apply")
	buf := make([]byte, 1)
	_, err = server.Read(buf)
	require.NoError(t, err)

	d.sending.Add(1)
	_, err = c.Write([]byte("p"))
	require.ErrorIs(t, err, ErrLeaseExpired)
	_, err = server.Read(buf)
	require.True(t, errors.Is(err, syscall.ECONNRESET), "the refused write was not sent, and the connection was reset: %v", err)
	_, err = d.Dial("tcp", ln)
	require.ErrorIs(t, err, ErrFenced)
}

// listen is a broker stand-in on 127.0.0.1: its address, and the one
// connection it accepts.
func listen(t *testing.T) (string, <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	return ln.Addr().String(), accepted
}
