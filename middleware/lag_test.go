package middleware

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
)

func TestLag_GrowsWhileARecordWaitsAndIsZeroWhenIdle(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	l := NewLag()
	l.now = func() time.Time { return now }
	require.Zero(t, l.Seconds(), "idle")

	msg := message.NewMessage("1", nil)
	// A record produced 3s ago, held by a retry.
	l.stamp = func(*message.Message) (time.Time, bool) { return now.Add(-3 * time.Second), true }
	release := make(chan struct{})
	entered := make(chan struct{})
	h := l.Middleware(func(*message.Message) ([]*message.Message, error) {
		close(entered)
		<-release
		return nil, nil
	})
	done := make(chan struct{})
	go func() { _, _ = h(msg); close(done) }()
	<-entered
	require.InDelta(t, 3, l.Seconds(), 0.001)
	l.mu.Lock()
	now = now.Add(10 * time.Second)
	l.mu.Unlock()
	require.InDelta(t, 13, l.Seconds(), 0.001, "lag grows while the record waits")
	close(release)
	<-done
	require.InDelta(t, 13, l.Seconds(), 0.001, "just finished: the last record's lag")
	l.mu.Lock()
	now = now.Add(recentWindow)
	l.mu.Unlock()
	require.Zero(t, l.Seconds(), "idle again")
}
