package middleware_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/middleware"
)

// TestRetry_NoConflictRetriesSendsAConflictToTheDLQAtOnce: zero conflict
// retries can be set, and then a conflict is Permanent after its one run.
func TestRetry_NoConflictRetriesSendsAConflictToTheDLQAtOnce(t *testing.T) {
	b := setupRetry(t, middleware.RetryConfig{NoConflictRetries: true},
		func(int) error { return fmt.Errorf("update card: %w", errConflict) })

	_, err := b.retry(newMessage(t))

	var perm *middleware.Permanent
	require.ErrorAs(t, err, &perm)
	require.Equal(t, middleware.CodeConflictExhausted, perm.Code)
	require.EqualValues(t, 1, b.calls.Load(), "one run, no re-run")
	require.Empty(t, b.retried())
}

// TestRetry_UnsetConflictRetriesAreTheSeedsThree: a config that says
// nothing of conflicts gets the seed's 3 re-runs, and one that sets both a
// count and no retries is refused.
func TestRetry_UnsetConflictRetriesAreTheSeedsThree(t *testing.T) {
	b := setupRetry(t, middleware.RetryConfig{}, func(int) error { return errConflict })

	_, err := b.retry(newMessage(t))

	require.Error(t, err)
	require.EqualValues(t, 1+middleware.RetryConflictRetriesDefault, b.calls.Load())
	require.Equal(t, 3, middleware.RetryConflictRetriesDefault)
	err = middleware.RetryConfig{IsConflict: func(error) bool { return false }, ConflictRetries: 2, NoConflictRetries: true}.Validate()
	require.ErrorContains(t, err, "conflict retries")
}
