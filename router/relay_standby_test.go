package router_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestRelay_PublishesOnlyWhatTheStandbyFlushed: with RELAY_STANDBY_FLUSH
// naming a standby, an event committed while that standby is cut off from
// the primary stays off Kafka, however long the cut lasts (a failover then
// would lose its change: a phantom), and reaches Kafka once the standby has
// it again.
func TestRelay_PublishesOnlyWhatTheStandbyFlushed(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartServer(t, pgtest.ServerOptions{})
	standby := srv.StartStandby(t, "replica1")
	b := promotionBundle{db: pgtest.Open(t, pgtest.DatabaseURLOn(t, srv.URL("sslmode=disable"))), topic: kafkatest.Topic(t, 1)}
	var standbys outbox.Standbys
	require.NoError(t, standbys.Set("replica1"))
	b.startRouter(t, router.PromotionConfig{RelayStandbyFlush: standbys, RelayPublishTimeout: 2 * time.Second},
		expire.Config{Interval: time.Hour}, slog.New(slog.DiscardHandler))

	writeOutbox(t, b, purchaseEvents(t, 2, "standby-attached"))
	require.Eventually(t, func() bool { return catalogtest.TopicSize(t, b.topic) == 2 }, 30*time.Second, 20*time.Millisecond,
		"events the standby has are published")

	standby.Detach(t)
	writeOutbox(t, b, purchaseEvents(t, 3, "standby-detached"), purchaseEvents(t, 1, "standby-detached"))
	// Two ack deadlines of the relay (2s + 2s each): it read the page again
	// and was held again.
	require.Never(t, func() bool { return catalogtest.TopicSize(t, b.topic) > 2 }, 8*time.Second, 100*time.Millisecond,
		"an event the detached standby has not flushed reached Kafka")
	require.Equal(t, 1.0, testutil.ToFloat64(b.metrics.OutboxStandbyHeld), "the relay reports that the standby holds it back")

	standby.Attach(t)
	require.Eventually(t, func() bool { return catalogtest.TopicSize(t, b.topic) == 6 }, time.Minute, 50*time.Millisecond,
		"the events are published once the standby has them")
	require.Eventually(t, func() bool { return testutil.ToFloat64(b.metrics.OutboxStandbyHeld) == 0 }, 30*time.Second, 20*time.Millisecond)
	require.Positive(t, testutil.CollectAndCount(b.metrics.OutboxStandbyWait))
}
