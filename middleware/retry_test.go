package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/logtest"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// errConflict stands for the business handler's optimistic-lock sentinel
// (boost.ErrConflict), which this package must not import.
var errConflict = errors.New("optimistic-lock conflict")

var errInfra = errors.New("dial tcp 127.0.0.1:5432: connection refused")

type retryCall struct {
	kind    string
	attempt int
	delay   time.Duration
}

type retryBundle struct {
	logs  *logtest.Logs
	dlq   *recordingPublisher
	calls atomic.Int32

	mu      sync.Mutex
	retries []retryCall

	retry         message.HandlerFunc
	deadLettering message.HandlerFunc
}

func (b *retryBundle) retried() []retryCall {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]retryCall(nil), b.retries...)
}

// setupRetry builds Retry(cfg) around a handler that returns fail(call) for
// call = 1, 2, ...; retry is that chain alone, and deadLettering puts a
// PoisonQueue with a recording publisher in front of it.
func setupRetry(t *testing.T, cfg middleware.RetryConfig, fail func(call int) error) *retryBundle {
	t.Helper()
	t.Parallel()
	b := &retryBundle{logs: &logtest.Logs{}, dlq: &recordingPublisher{}}
	cfg.IsConflict = func(err error) bool { return errors.Is(err, errConflict) }
	cfg.Logger = b.logs.Logger()
	cfg.OnRetry = func(_ *message.Message, kind string, attempt int, delay time.Duration, _ error) {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.retries = append(b.retries, retryCall{kind, attempt, delay})
	}
	retry, err := middleware.Retry(cfg)
	require.NoError(t, err)
	poison, err := middleware.PoisonQueue(b.dlq, middleware.PoisonConfig{Logger: b.logs.Logger()})
	require.NoError(t, err)
	b.retry = retry(func(*message.Message) ([]*message.Message, error) {
		return nil, fail(int(b.calls.Add(1)))
	})
	b.deadLettering = poison(b.retry)
	return b
}

func TestRetry_InfrastructureErrorRetriesWithBackoffAndNeverDeadLetters(t *testing.T) {
	const failures = 12
	b := setupRetry(t, middleware.RetryConfig{
		InitialInterval: time.Millisecond,
		MaxInterval:     8 * time.Millisecond,
	}, func(call int) error {
		if call <= failures {
			return fmt.Errorf("load contributions: %w", errInfra)
		}
		return nil
	})

	_, err := b.deadLettering(newMessage(t))

	require.NoError(t, err, "the message is applied once the infrastructure is back")
	require.EqualValues(t, failures+1, b.calls.Load())
	retries := b.retried()
	require.Len(t, retries, failures)
	wantDelays := []time.Duration{1, 2, 4, 8, 8, 8, 8, 8, 8, 8, 8, 8}
	for i, r := range retries {
		require.Equal(t, retryCall{middleware.RetryInfrastructure, i + 1, wantDelays[i] * time.Millisecond}, r)
	}
	require.Empty(t, b.dlq.published(), "infrastructure errors never reach the DLQ")
	logged := b.logs.Find(slog.LevelWarn, "retrying")
	require.Len(t, logged, failures, "each retry is logged once")
	require.Equal(t, "1", logged[0]["attempt"])
	require.Equal(t, "1ms", logged[0]["delay"])
}

func TestRetry_InfrastructureRetryStopsWhenMessageContextEndsAndNacks(t *testing.T) {
	b := setupRetry(t, middleware.RetryConfig{
		InitialInterval: time.Millisecond,
		MaxInterval:     time.Millisecond,
	}, func(int) error { return errInfra })
	ctx, cancel := context.WithCancel(context.Background())
	msg := newMessage(t)
	msg.SetContext(ctx)

	done := make(chan error, 1)
	go func() { _, err := b.deadLettering(msg); done <- err }()
	require.Eventually(t, func() bool { return b.calls.Load() >= 5 }, 5*time.Second, time.Millisecond,
		"the retry has no end of its own")
	cancel()

	var err error
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("retry did not stop when the message context ended")
	}
	require.ErrorIs(t, err, errInfra, "the error is returned, so the router nacks the message")
	var perm *middleware.Permanent
	require.False(t, errors.As(err, &perm))
	require.Empty(t, b.dlq.published())
}

func TestRetry_InfrastructureRetryStopsOnClose(t *testing.T) {
	closing := make(chan struct{})
	b := setupRetry(t, middleware.RetryConfig{
		InitialInterval: time.Hour,
		MaxInterval:     time.Hour,
		Close:           closing,
	}, func(int) error { return errInfra })

	done := make(chan error, 1)
	go func() { _, err := b.deadLettering(newMessage(t)); done <- err }()
	require.Eventually(t, func() bool { return len(b.retried()) == 1 }, 5*time.Second, time.Millisecond)
	close(closing)

	select {
	case err := <-done:
		require.ErrorIs(t, err, errInfra)
	case <-time.After(5 * time.Second):
		t.Fatal("retry did not stop on close")
	}
	require.Empty(t, b.dlq.published())
}

func TestRetry_ConflictRetriesThreeTimesThenPermanent(t *testing.T) {
	// An hour of backoff proves that conflict re-runs do not wait.
	b := setupRetry(t, middleware.RetryConfig{InitialInterval: time.Hour, MaxInterval: time.Hour},
		func(int) error { return fmt.Errorf("update card: %w", errConflict) })

	_, err := b.retry(newMessage(t))

	var perm *middleware.Permanent
	require.ErrorAs(t, err, &perm)
	require.Equal(t, middleware.CodeConflictExhausted, perm.Code)
	require.ErrorIs(t, err, errConflict, "the cause stays reachable")
	require.EqualValues(t, 4, b.calls.Load(), "one run and three re-runs")
	require.Equal(t, []retryCall{
		{middleware.RetryConflict, 1, 0},
		{middleware.RetryConflict, 2, 0},
		{middleware.RetryConflict, 3, 0},
	}, b.retried())
}

func TestRetry_ConflictThatClearsIsApplied(t *testing.T) {
	b := setupRetry(t, middleware.RetryConfig{}, func(call int) error {
		if call <= 2 {
			return errConflict
		}
		return nil
	})

	_, err := b.retry(newMessage(t))

	require.NoError(t, err)
	require.EqualValues(t, 3, b.calls.Load())
}

func TestRetry_ConflictRerunsTheUnitOfWorkInAFreshTransaction(t *testing.T) {
	t.Parallel()
	db := catalogDB(t)
	retry, err := middleware.Retry(middleware.RetryConfig{
		IsConflict: func(err error) bool { return errors.Is(err, errConflict) },
		Logger:     slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	var txids []int64
	uow, err := middleware.NewGroupCommit(middleware.GroupCommitConfig{DB: db},
		func(ctx context.Context, tx *sqlx.Tx, ids []string) ([]struct{}, error) {
			var txid int64
			if err := tx.GetContext(ctx, &txid, `SELECT txid_current()`); err != nil {
				return nil, err
			}
			txids = append(txids, txid)
			if len(txids) < 3 {
				return nil, errConflict
			}
			return make([]struct{}, len(ids)), applyEffect(ctx, tx, ids[0])
		}, nil)
	require.NoError(t, err)

	msg := newMessage(t)
	_, err = chain(func(msg *message.Message) ([]*message.Message, error) {
		_, _, err := uow.Do(msg, msg.UUID, msg.UUID)
		return nil, err
	}, retry)(msg)

	require.NoError(t, err)
	require.Len(t, txids, 3)
	require.NotEqual(t, txids[0], txids[1])
	require.NotEqual(t, txids[1], txids[2])
	require.Equal(t, 1, effectCount(t, db, msg.UUID))
}

func TestRetry_ContractViolationIsPermanentWithoutRetry(t *testing.T) {
	b := setupRetry(t, middleware.RetryConfig{}, func(int) error {
		// Wrapped in a conflict too: a contract violation wins over any other class.
		return fmt.Errorf("parse payload: %w", errors.Join(errConflict,
			&event.ContractError{Field: "BoostWeight", Reason: "must be within 1..100"}))
	})

	_, err := b.retry(newMessage(t))

	var perm *middleware.Permanent
	require.ErrorAs(t, err, &perm)
	require.Equal(t, middleware.CodeContractViolation, perm.Code)
	require.Equal(t, "contract violation: BoostWeight: must be within 1..100", perm.Reason)
	var ce *event.ContractError
	require.ErrorAs(t, err, &ce, "the cause stays reachable")
	require.EqualValues(t, 1, b.calls.Load(), "no retry")
	require.Empty(t, b.retried())
}

func TestRetry_ConfigNeedsAConflictClassifier(t *testing.T) {
	t.Parallel()
	_, err := middleware.Retry(middleware.RetryConfig{})
	require.ErrorContains(t, err, "conflict classifier is required")
}

func TestRetry_InfrastructureErrorPausesItsPartitionUntilItClears(t *testing.T) {
	t.Parallel()
	source := kafkatest.Topic(t, 1)
	dlq := &recordingPublisher{}
	poison, err := middleware.PoisonQueue(dlq, middleware.PoisonConfig{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	var retries atomic.Int32
	retry, err := middleware.Retry(middleware.RetryConfig{
		IsConflict:      func(error) bool { return false },
		InitialInterval: 5 * time.Millisecond,
		MaxInterval:     20 * time.Millisecond,
		Logger:          slog.New(slog.DiscardHandler),
		OnRetry:         func(*message.Message, string, int, time.Duration, error) { retries.Add(1) },
	})
	require.NoError(t, err)

	first, second := newMessage(t), newMessage(t)
	var databaseUp atomic.Bool
	var mu sync.Mutex
	var applied []string
	runConsumer(t, source, func(msg *message.Message) error {
		if msg.UUID == first.UUID && !databaseUp.Load() {
			return fmt.Errorf("begin unit of work: %w", errInfra)
		}
		mu.Lock()
		defer mu.Unlock()
		applied = append(applied, msg.UUID)
		return nil
	}, poison, retry)
	appliedNow := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), applied...)
	}

	src := kafkaPublisher(t, kafka.DefaultMarshaler{})
	require.NoError(t, src.Publish(source, first, second))
	require.Eventually(t, func() bool { return retries.Load() >= 5 }, 30*time.Second, 5*time.Millisecond)
	require.Empty(t, appliedNow(), "the message behind the failing one waits: the partition is paused")

	databaseUp.Store(true)
	require.Eventually(t, func() bool { return len(appliedNow()) == 2 }, 30*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{first.UUID, second.UUID}, appliedNow(), "order is kept")
	require.Empty(t, dlq.published())
}

// TestRetry_YieldsPartitionOnRebalance: a member stuck in an endless
// infrastructure retry gives its partition up when the group rebalances, so
// a second member gets partitions within the session timeout (10s), instead of
// the whole group waiting for the rebalance timeout and evicting the first.
func TestRetry_YieldsPartitionOnRebalance(t *testing.T) {
	t.Parallel()
	topic := kafkatest.Topic(t, 2)
	group := "pf-test-" + kafkatest.RandomSuffix()
	logs := &logtest.Logs{}
	claims := middleware.NewClaims()
	var retries, yields atomic.Int32
	retry, err := middleware.Retry(middleware.RetryConfig{
		IsConflict:      func(error) bool { return false },
		InitialInterval: 50 * time.Millisecond,
		MaxInterval:     200 * time.Millisecond,
		Logger:          logs.Logger(),
		OnRetry:         func(*message.Message, string, int, time.Duration, error) { retries.Add(1) },
		OnYield:         func(*message.Message) { yields.Add(1) },
		Session:         claims.Session,
	})
	require.NoError(t, err)
	pub := kafkaPublisher(t, kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return msg.UUID, nil
	}))
	for range 20 {
		require.NoError(t, pub.Publish(topic, newMessage(t)))
	}

	// The first member owns both partitions and cannot apply anything.
	runGroupConsumer(t, topic, group, claims.Tracer(nil), func(*message.Message) error {
		return fmt.Errorf("begin unit of work: %w", errInfra)
	}, retry)
	require.Eventually(t, func() bool { return retries.Load() >= 3 }, 30*time.Second, 10*time.Millisecond)

	var applied atomic.Int32
	joined := time.Now()
	runGroupConsumer(t, topic, group, nil, func(*message.Message) error { applied.Add(1); return nil })
	require.Eventually(t, func() bool { return applied.Load() > 0 }, 10*time.Second, 10*time.Millisecond,
		"the second member got no partition within the session timeout")
	t.Logf("second member applied its first message %s after joining", time.Since(joined).Round(time.Millisecond))
	require.Positive(t, yields.Load())
	require.NotEmpty(t, logs.Find(slog.LevelWarn, "partition revoked during retry; left to its next owner"))
}

func TestRetry_WithoutASessionNeverYields(t *testing.T) {
	calls := 0
	b := setupRetry(t, middleware.RetryConfig{
		InitialInterval: time.Millisecond,
		MaxInterval:     time.Millisecond,
		Session:         func(*message.Message) context.Context { return nil },
	}, func(int) error {
		calls++
		if calls < 3 {
			return errInfra
		}
		return nil
	})
	_, err := b.retry(newMessage(t))
	require.NoError(t, err)
	require.EqualValues(t, 3, b.calls.Load())
}
