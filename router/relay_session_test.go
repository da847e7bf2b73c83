package router_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestRelay_HolderThatLostItsSessionStopsPublishing: of two promotion
// processes, the one that holds the outbox position loses its database
// session (pg_terminate_backend) in the middle of a page of 100 rows of 500
// events. The other takes the position and publishes the page again; the old
// holder publishes nothing once it has: in each partition no record of the old
// holder's producer follows one of the new holder's. Every event is on the
// topic and every key's versions are in order there.
func TestRelay_HolderThatLostItsSessionStopsPublishing(t *testing.T) {
	t.Parallel()
	url, topic := pgtest.DatabaseURL(t), kafkatest.Topic(t, 6)
	procs := [2]promotionBundle{{db: pgtest.Open(t, url), topic: topic}, {db: pgtest.Open(t, url), topic: topic}}
	// 25,000 purchases' v1 in 50 transactions, then their v2 in 50 more:
	// one page, longer to publish than a takeover waits.
	const purchases, perTx = 25_000, 500
	ids := make([]uuid.UUID, purchases)
	for i := range ids {
		ids[i] = uuid.New()
	}
	var txs [][]*message.Message
	var all []*message.Message
	for v := int64(1); v <= 2; v++ {
		for i := 0; i < purchases; i += perTx {
			var tx []*message.Message
			for _, id := range ids[i : i+perTx] {
				tx = append(tx, versionMessage(t, id, v, "lost-session"))
			}
			txs = append(txs, tx)
			all = append(all, tx...)
		}
	}
	writeOutbox(t, procs[0], txs...)
	for i := range procs {
		procs[i].startRouter(t, router.PromotionConfig{}, expire.Config{Interval: time.Hour}, slog.New(slog.DiscardHandler))
	}

	require.Eventually(t, func() bool { return topicSize(t, topic) >= 1_000 }, time.Minute, 2*time.Millisecond,
		"the holder publishes its page")
	pid := relayHolderPid(t, procs[0].db)
	procs[0].db.MustExec(`SELECT pg_terminate_backend($1)`, pid)
	atKill := topicSize(t, topic)
	require.Less(t, atKill, int64(len(all)), "the session was cut before the page was published whole")
	t.Logf("cut the holder's session (pid %d) with %d of %d events on the topic", pid, atKill, len(all))

	records := readProduced(t, topic, uuidsOf(all))

	byPartition := map[int32][]*kgo.Record{}
	for _, r := range records {
		byPartition[r.Partition] = append(byPartition[r.Partition], r)
	}
	for p, rs := range byPartition {
		old := rs[0].ProducerID
		successor := -1
		for i, r := range rs {
			switch {
			case r.ProducerID != old && successor < 0:
				successor = i
			case r.ProducerID == old && successor >= 0:
				t.Fatalf("partition %d: the old holder's producer %d published offset %d after the new holder's "+
					"producer %d published offset %d: both published at once", p, old, r.Offset,
					rs[successor].ProducerID, rs[successor].Offset)
			}
		}
	}
	last := map[string]int64{}
	for _, r := range records {
		ev, err := event.Parse(r.Value)
		require.NoError(t, err)
		require.GreaterOrEqual(t, ev.Version, last[string(r.Key)], "key %s: v%d at %d/%d follows v%d",
			r.Key, ev.Version, r.Partition, r.Offset, last[string(r.Key)])
		last[string(r.Key)] = ev.Version
	}
	lost := testutil.ToFloat64(procs[0].metrics.OutboxPositionLost) + testutil.ToFloat64(procs[1].metrics.OutboxPositionLost)
	require.EqualValues(t, 1, lost, "one process lost its position session, and said so")
}

// relayHolderPid is the backend of the session that holds the outbox
// position: its transaction's id is the last holder's.
func relayHolderPid(t *testing.T, db *sqlx.DB) int {
	t.Helper()
	var pid int
	require.NoError(t, db.Get(&pid, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()
		AND backend_xid::text::bigint = (SELECT last_value FROM promotion.outbox_relay_holder) % 4294967296`))
	return pid
}

// topicSize is how many records topic holds.
func topicSize(t *testing.T, topic string) int64 {
	t.Helper()
	client, err := sarama.NewClient(kafkatest.Brokers(t), kafkatest.Cluster(t).ClientConfig("promoflow-test"))
	require.NoError(t, err)
	defer client.Close()
	parts, err := client.Partitions(topic)
	require.NoError(t, err)
	var n int64
	for _, p := range parts {
		end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		require.NoError(t, err)
		n += end
	}
	return n
}

// readProduced reads topic from its start, with each record's producer id,
// until every message id of want is there; it fails when a minute passes
// with no new one (a relay under -race on a loaded machine is slow, not
// stopped).
func readProduced(t *testing.T, topic string, want []string) []*kgo.Record {
	t.Helper()
	client, err := kgo.NewClient(kgo.SeedBrokers(kafkatest.Brokers(t)...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer client.Close()
	missing := map[string]bool{}
	for _, id := range want {
		missing[id] = true
	}
	var out []*kgo.Record
	for len(missing) > 0 {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		fetches := client.PollFetches(ctx)
		timedOut := ctx.Err() != nil
		cancel()
		if timedOut {
			require.Failf(t, "events missing from the topic", "%d of %d, none new for a minute", len(missing), len(want))
		}
		require.NoError(t, fetches.Err0(), "read %s", topic)
		fetches.EachRecord(func(r *kgo.Record) {
			out = append(out, r)
			for _, h := range r.Headers {
				if h.Key == kafka.UUIDHeaderKey {
					delete(missing, string(h.Value))
				}
			}
		})
	}
	return out
}
