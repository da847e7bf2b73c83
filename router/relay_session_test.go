package router_test

import (
	"context"
	"fmt"
	"strings"
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
	"github.com/promoflow/promoflow/handlers/logtest"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestRelay_HolderThatLostItsSessionStopsPublishing: of two promotion
// processes, the one that holds the outbox position loses its database
// session (pg_terminate_backend) in the middle of a page of 100 rows of 500
// events. The other takes the position and publishes the page again; the old
// holder publishes nothing once it has: in each partition the producer
// changes once per handover of the position, where two holders publishing at
// once interleave. Every event is on the topic, and every key's versions are
// in order there (after a further handover, which a loaded machine can cause,
// each key's last record is its latest version).
func TestRelay_HolderThatLostItsSessionStopsPublishing(t *testing.T) {
	t.Parallel()
	// What failed is said again after the processes' logs, which bury it.
	st := &lastWords{T: t}
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
	// Each process's log is printed if the test fails.
	var logs [2]logtest.Logs
	// The first process takes the position before the second starts, so
	// that the session cut is the first's.
	procs[0].startRouter(t, router.PromotionConfig{}, expire.Config{Interval: time.Hour}, logs[0].Logger())
	require.Eventually(st, func() bool { return topicSize(t, topic) > 0 }, time.Minute, 2*time.Millisecond,
		"the first process publishes")
	procs[1].startRouter(t, router.PromotionConfig{}, expire.Config{Interval: time.Hour}, logs[1].Logger())
	t.Cleanup(func() {
		if t.Failed() {
			for i := range logs {
				t.Logf("process %d's log:\n%s", i, strings.Join(logs[i].All(), "\n"))
			}
			t.Logf("failed: %s", st.said)
		}
	})

	require.Eventually(t, func() bool { return topicSize(t, topic) >= 1_000 }, time.Minute, 2*time.Millisecond,
		"the holder publishes its page")
	pid := relayHolderPid(t, procs[0].db)
	procs[0].db.MustExec(`SELECT pg_terminate_backend($1)`, pid)
	atKill := topicSize(t, topic)
	require.Less(st, atKill, int64(len(all)), "the session was cut before the page was published whole")
	t.Logf("cut the holder's session (pid %d) with %d of %d events on the topic", pid, atKill, len(all))

	records := readProduced(t, topic, uuidsOf(all))

	// The position changed hands once for the cut, and once more for each
	// other loss or step back (under -race on a loaded machine a check of
	// the new holder's session can outlast its lease: it then gives the
	// position up, and the old holder, waiting for it, takes it back).
	lostBy := func(i int) float64 { return testutil.ToFloat64(procs[i].metrics.OutboxPositionLost) }
	stepBacks := testutil.ToFloat64(procs[0].metrics.OutboxStepBacks) + testutil.ToFloat64(procs[1].metrics.OutboxStepBacks)
	require.EqualValues(st, 1, lostBy(0), "the holder whose session was cut lost its position, and said so")
	handovers := int(lostBy(0) + lostBy(1) + stepBacks)
	if handovers > 1 {
		t.Logf("the position changed hands %d times (losses %v and %v, step backs %v)", handovers, lostBy(0), lostBy(1), stepBacks)
	}

	// Two holders that publish at once interleave their records in a
	// partition; holders one after another make one run each. A run that
	// publishes again what an earlier run of the partition did follows a
	// holder that lost the position (or stepped back) before its ack; a run
	// of events new to the partition follows a page that its holder acked,
	// after which either process may take the next page. So in each
	// partition the producer changes to publish again at most once per
	// handover.
	byPartition := map[int32][]*kgo.Record{}
	for _, r := range records {
		byPartition[r.Partition] = append(byPartition[r.Partition], r)
	}
	for p, rs := range byPartition {
		if again := republishingRuns(rs); len(again) > handovers {
			st.Fatalf("partition %d: the producer changed %d times to publish again while the position changed hands %d times: "+
				"two holders published at once (%s)", p, len(again), handovers, strings.Join(again, "; "))
		}
	}
	// Each key's versions are in order on the topic. A second handover
	// publishes the page again from its last ack, so a key's earlier
	// versions may come again after its later ones; its last record is
	// still its latest version, which compaction keeps.
	last, highest := map[string]int64{}, map[string]int64{}
	for _, r := range records {
		ev, err := event.Parse(r.Value)
		require.NoError(st, err)
		if handovers == 1 {
			require.GreaterOrEqual(st, ev.Version, last[string(r.Key)], "key %s: v%d at %d/%d follows v%d",
				r.Key, ev.Version, r.Partition, r.Offset, last[string(r.Key)])
		}
		last[string(r.Key)], highest[string(r.Key)] = ev.Version, max(highest[string(r.Key)], ev.Version)
	}
	for key, v := range last {
		require.Equal(st, highest[key], v, "key %s: its last record on the topic is not its latest version", key)
	}
}

// lastWords is a test that keeps what it last failed with, for a test
// whose cleanup prints so much that the failure scrolls out of sight.
type lastWords struct {
	*testing.T
	said string
}

func (l *lastWords) Errorf(format string, args ...any) {
	l.said = fmt.Sprintf(format, args...)
	l.T.Errorf(format, args...)
}

func (l *lastWords) Fatalf(format string, args ...any) {
	l.said = fmt.Sprintf(format, args...)
	l.T.Fatalf(format, args...)
}

// republishingRuns names each run of one producer in a partition's records
// after the first that holds an event an earlier run of the partition
// published.
func republishingRuns(rs []*kgo.Record) []string {
	var again []string
	seen := map[string]bool{}
	for start := 0; start < len(rs); {
		end := start
		repeats := false
		for ; end < len(rs) && rs[end].ProducerID == rs[start].ProducerID; end++ {
			repeats = repeats || seen[recordUUID(rs[end])]
		}
		if repeats && start > 0 {
			again = append(again, fmt.Sprintf("producer %d → %d at offset %d", rs[start-1].ProducerID, rs[start].ProducerID, rs[start].Offset))
		}
		for _, r := range rs[start:end] {
			seen[recordUUID(r)] = true
		}
		start = end
	}
	return again
}

// recordUUID is a record's message id.
func recordUUID(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == kafka.UUIDHeaderKey {
			return string(h.Value)
		}
	}
	return ""
}

// relayHolderPid is the backend of the session that holds the outbox
// position: its transaction's id is the last holder's.
func relayHolderPid(t *testing.T, db *sqlx.DB) int {
	t.Helper()
	pid, err := holderPid(db)
	require.NoError(t, err)
	return pid
}

// holderPid is relayHolderPid's, or sql.ErrNoRows while no transaction holds
// the position.
func holderPid(db *sqlx.DB) (int, error) {
	var pid int
	err := db.Get(&pid, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()
		AND backend_xid::text::bigint = (SELECT last_value FROM promotion.outbox_relay_holder) % 4294967296`)
	return pid, err
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
			delete(missing, recordUUID(r))
		})
	}
	return out
}

// TestRepublishingRuns_CountsOnlyRunsThatPublishAgain: the lost-session
// test's check tells a holder after an ack (new events) from one that
// publishes again what another did, and from two that interleave.
func TestRepublishingRuns_CountsOnlyRunsThatPublishAgain(t *testing.T) {
	records := func(runs ...[]any) []*kgo.Record {
		var rs []*kgo.Record
		for _, run := range runs {
			for _, id := range run[1:] {
				rs = append(rs, &kgo.Record{ProducerID: int64(run[0].(int)), Offset: int64(len(rs)),
					Headers: []kgo.RecordHeader{{Key: kafka.UUIDHeaderKey, Value: []byte(id.(string))}}})
			}
		}
		return rs
	}
	require.Empty(t, republishingRuns(records([]any{1, "a", "b"})))
	// cut after b: the next holder publishes a and b again, then the first takes the next page
	require.Len(t, republishingRuns(records([]any{1, "a", "b"}, []any{2, "a", "b", "c"}, []any{1, "d"})), 1)
	// the cut holder goes on publishing while the next publishes again
	require.Len(t, republishingRuns(records([]any{1, "a", "b"}, []any{2, "a"}, []any{1, "c"}, []any{2, "b", "c"})), 2)
}
