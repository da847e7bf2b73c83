package router_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/app/testenv"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/handlers/purchase"
)

// relayEvents is how many outbox events one benchmark iteration relays.
const relayEvents = 5_000

// BenchmarkRelay measures the outbox relay: events/s from the SQL outbox to
// real Kafka (acks=all, idempotent producer), until every row is acked.
func BenchmarkRelay(b *testing.B) {
	var secs float64
	for range b.N {
		bundle := promotionBundle{db: testenv.DB(b), topic: testenv.Topic(b, 6)}
		tx, err := bundle.db.Beginx()
		require.NoError(b, err)
		msgs := make([]*message.Message, 0, relayEvents)
		for range relayEvents {
			p := purchase.Purchase{ID: uuid.New(), TenantID: uuid.New(), PackageKind: "Top",
				Targets:     []event.Target{{TargetKind: event.TargetProject, TargetId: uuid.New()}},
				BoostWeight: 10, Status: event.StatusExpired, PaymentStatus: purchase.PaymentNotRequired,
				StartsAt: time.Now().Add(-time.Hour), EndsAt: time.Now(), Version: 2}
			msg, err := event.NewMessage(p.Event(), "bench", time.Now())
			require.NoError(b, err)
			msgs = append(msgs, msg)
		}
		for i := 0; i < len(msgs); i += 1000 {
			require.NoError(b, outbox.PublishTx(tx, bundle.topic, msgs[i:min(i+1000, len(msgs))]...))
		}
		require.NoError(b, tx.Commit())

		start := time.Now()
		bundle.start(b, time.Hour)
		require.Eventually(b, func() bool {
			stats, err := outbox.ReadStats(b.Context(), bundle.db)
			return err == nil && stats.Backlog == 0
		}, 5*time.Minute, 5*time.Millisecond)
		secs += time.Since(start).Seconds()
	}
	b.ReportMetric(float64(relayEvents*b.N)/secs, "events/s")
}
