package middleware_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
)

// TestRetry_ContractErrorAfterRevocationYieldsInsteadOfDeadLettering: the
// partition is revoked while the handler runs, and the handler then fails
// for good. The offset of a revoked partition is not committed, so a dead
// letter written now would be written again by the next owner: the retry
// yields, and the next owner decides.
func TestRetry_ContractErrorAfterRevocationYieldsInsteadOfDeadLettering(t *testing.T) {
	for name, failure := range map[string]error{
		"contract violation": fmt.Errorf("parse payload: %w", &event.ContractError{Field: "BoostWeight", Reason: "must be within 1..100"}),
		"permanent already":  &middleware.Permanent{Code: middleware.CodeConflictExhausted, Reason: "conflict", Err: errConflict},
	} {
		t.Run(name, func(t *testing.T) {
			session, revoke := context.WithCancel(context.Background())
			defer revoke()
			var yields atomic.Int32
			b := setupRetry(t, middleware.RetryConfig{
				Session: func(*message.Message) context.Context { return session },
				OnYield: func(*message.Message) { yields.Add(1) },
			}, func(int) error {
				revoke() // a rebalance took the partition while the handler ran
				return failure
			})

			_, err := b.deadLettering(newMessage(t))

			require.NoError(t, err, "yielded: acked without its offset, for the next owner")
			require.Empty(t, b.dlq.published(), "nothing is dead-lettered for a partition this member lost")
			require.EqualValues(t, 1, yields.Load())
			require.EqualValues(t, 1, b.calls.Load())
			require.NotEmpty(t, b.logs.Find(slog.LevelWarn, "partition revoked during retry; left to its next owner"))
		})
	}
}
