package router_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// unanswered stands for a producer cut off from Kafka: each publish waits
// out the relay's publish timeout and fails as kafkakit.BatchPublisher does.
type unanswered struct {
	timeout time.Duration
	calls   atomic.Int64
}

func (u *unanswered) Publish(string, ...*message.Message) error {
	u.calls.Add(1)
	time.Sleep(u.timeout)
	return kafkakit.ErrPublishTimeout
}
func (u *unanswered) Close() error { return nil }

var errUnreachable = errors.New("kafka does not answer")

// TestRelay_HolderCutOffFromKafkaLetsAnotherProcessTakeThePosition: the
// relay of the first process holds the outbox position but gets no answer
// from Kafka while its database is fine. It steps back at its ack deadline
// and stays back while its probe fails; the second process takes the
// position and relays every event, in order; the first publishes nothing
// more.
func TestRelay_HolderCutOffFromKafkaLetsAnotherProcessTakeThePosition(t *testing.T) {
	b := setupPromotion(t, 1) // one partition: Kafka's order is the relay's order
	txs := [][]*message.Message{purchaseEvents(t, 3, "cut-off"), purchaseEvents(t, 1, "cut-off"), purchaseEvents(t, 5, "cut-off")}
	writeOutbox(t, b, txs...)
	cut := &unanswered{timeout: time.Second}
	b.startRouter(t, router.PromotionConfig{RelayPublisher: cut, RelayPublishTimeout: cut.timeout,
		RelayStepBack: outbox.StepBackConfig{Pause: 100 * time.Millisecond,
			Probe: func(context.Context) error { return errUnreachable }}},
		expire.Config{Interval: time.Hour}, slog.New(slog.DiscardHandler))
	cutMetrics := b.metrics
	require.Eventually(t, func() bool { return cut.calls.Load() == 1 }, 30*time.Second, 10*time.Millisecond,
		"the first process took the position")

	b.startRouter(t, router.PromotionConfig{}, expire.Config{Interval: time.Hour}, slog.New(slog.DiscardHandler))
	want, got := relayed(t, b.topic, txs)
	require.Equal(t, want, got, "the second process relayed every event once, in commit order")
	require.EqualValues(t, 1, cut.calls.Load(), "a process cut off from Kafka does not try again while its probe fails")
	require.EqualValues(t, 1, testutil.ToFloat64(cutMetrics.OutboxSteppedBack))
	require.EqualValues(t, 1, testutil.ToFloat64(cutMetrics.OutboxStepBacks))
}
