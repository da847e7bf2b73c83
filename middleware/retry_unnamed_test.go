package middleware_test

import (
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/middleware"
)

// TestRetry_UnnamedErrorIsDeadLetteredOnlyWhileOtherRecordsSucceed: an error
// the classes do not name keeps its record retrying, past the bound too,
// while nothing else succeeds (it may be the database's, for every record);
// once another record of the process succeeds, the record that still fails
// past the bound is dead-lettered as stuck.
func TestRetry_UnnamedErrorIsDeadLetteredOnlyWhileOtherRecordsSucceed(t *testing.T) {
	t.Parallel()
	bad, good := newMessage(t), newMessage(t)
	var badCalls atomic.Int32
	retry, err := middleware.Retry(middleware.RetryConfig{
		IsConflict:      func(error) bool { return false },
		InitialInterval: time.Millisecond, MaxInterval: time.Millisecond,
		UnnamedAttempts: 5, UnnamedAfter: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	h := retry(func(msg *message.Message) ([]*message.Message, error) {
		if msg.UUID == bad.UUID {
			badCalls.Add(1)
			return nil, errors.New("an error of no class")
		}
		return nil, nil
	})

	done := make(chan error, 1)
	go func() { _, err := h(bad); done <- err }()
	start := time.Now()
	require.Eventually(t, func() bool { return badCalls.Load() > 10 && time.Since(start) > 50*time.Millisecond },
		5*time.Second, time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("dead-lettered while no other record succeeded: %v", err)
	default:
	}

	_, err = h(good)
	require.NoError(t, err)

	select {
	case err := <-done:
		var perm *middleware.Permanent
		require.ErrorAs(t, err, &perm)
		require.Equal(t, middleware.CodeStuckRecord, perm.Code)
		require.Contains(t, perm.Reason, "an error of no class")
	case <-time.After(5 * time.Second):
		t.Fatal("the record still retries after another record succeeded")
	}
}
