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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	d := newFencedDialer(time.Second, 0)
	c, err := d.Dial("tcp", ln.Addr().String())
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
	_, err = d.Dial("tcp", ln.Addr().String())
	require.ErrorIs(t, err, ErrFenced)
}
