package main

import (
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// The outbox of TestRelay_FrozenHolderIsFencedWithinItsLease: fenceRows
// rows (one transaction each, one page each) of fenceKeys events, one per
// purchase and a version a row, each event fenceTargets targets big (3 MB a
// row), so that a row goes to Kafka in a few produce requests one after the
// other (the first holds one record) and a freeze lands between them.
const (
	fenceRows    = 4
	fenceKeys    = 200
	fenceTargets = 200
)

// TestRelay_FrozenHolderIsFencedWithinItsLease: a relay process frozen
// (SIGSTOP) while it publishes a page, whose database session then ends (as
// the database ends an idle one), leaves nothing on the topic that a
// read_committed consumer sees, neither what it had sent before it froze nor
// what it sends after it thaws, once a second process took the position
// over: every event is on the topic once, in order per purchase. The
// processes run with RELAY_TRANSACTIONAL_ID set (it is off by default).
func TestRelay_FrozenHolderIsFencedWithinItsLease(t *testing.T) {
	t.Parallel()
	url := pgtest.DatabaseURL(t)
	db := pgtest.Open(t, url)
	topic := kafkatest.TopicWith(t, kafkakit.Topic{Partitions: 1, CleanupPolicy: kafkakit.PolicyCompact})
	env := envOf("KAFKA_BROKERS="+strings.Join(kafkatest.Brokers(t), ","), "LOG_LEVEL=warn", "PROMOTION_TOPIC="+topic,
		"KAFKA_CREATE_TOPICS=false", "EXPIRE_INTERVAL=1h", "OUTBOX_BATCH_SIZE=1", "RELAY_TRANSACTIONAL_ID=promoflow-promotion-relay."+topic)

	want := map[string]int64{} // MessageId → version
	for v := int64(1); v <= fenceRows; v++ {
		msgs := make([]*message.Message, fenceKeys)
		for i := range msgs {
			ev := catalogtest.PurchaseEvent(event.StatusActive, v, 1, bigTargets()...)
			ev.PurchaseId = uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "%s-%d", topic, i))
			msg, err := event.NewMessage(ev, "fence-test", time.Now())
			require.NoError(t, err)
			msgs[i], want[msg.UUID] = msg, v
		}
		tx, err := outbox.BeginTx(t.Context(), db, nil)
		require.NoError(t, err)
		require.NoError(t, outbox.PublishTx(tx, topic, msgs...))
		require.NoError(t, tx.Commit())
	}

	// The first relay publishes alone; it is frozen as soon as a row is partly
	// on Kafka, while its publish of that row goes on.
	uncommitted := readAll(t, topic, sarama.ReadUncommitted)
	first := startCommand(t, with(env, "DATABASE_URL", url+"&application_name=relay-frozen", "HTTP_ADDR", freeAddr(t)), "promotion")
	require.Eventually(t, func() bool {
		n := uncommitted.len()
		return n > 0 && n%fenceKeys != 0
	}, 2*time.Minute, time.Millisecond, "no row was ever seen partly on the topic; output:\n%s", first)
	first.signal(t, syscall.SIGSTOP)
	start := time.Now()
	t.Logf("the first relay is frozen with %d records on the topic", uncommitted.len())
	// Its session ends under it, as idle_in_transaction_session_timeout
	// ends a frozen holder's: the position is free.
	db.MustExec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'relay-frozen'`)

	addr := freeAddr(t)
	second := startCommand(t, with(env, "DATABASE_URL", url, "HTTP_ADDR", addr), "promotion")
	second.waitReady(t, addr)
	t.Logf("the second relay is ready after %s", time.Since(start).Round(time.Millisecond))
	committed := readAll(t, topic, sarama.ReadCommitted)
	require.Eventually(t, func() bool { return committed.distinct() >= len(want) }, 3*time.Minute, 10*time.Millisecond,
		"the second relay did not publish every event; output:\n%s", second)
	t.Logf("every event is on the topic after %s", time.Since(start).Round(time.Millisecond))

	// The thawed relay goes on until it is back on the database; it stops
	// gracefully, so whatever it still had to send it sends before it exits.
	first.signal(t, syscall.SIGCONT)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'relay-frozen'`))
		return n > 0
	}, time.Minute, 10*time.Millisecond, "the thawed relay did not come back to the database; output:\n%s", first)
	first.stop()

	got := committed.untilEnd(t, topic)
	seen := map[string]int{}
	last := map[string]int64{} // key → version
	var dups, outOfOrder int
	for _, m := range got {
		id := kafkatest.Header(m, kafka.UUIDHeaderKey)
		v, ok := want[id]
		require.True(t, ok, "record %s at offset %d is no event of the outbox", id, m.Offset)
		if seen[id]++; seen[id] > 1 {
			dups++
			continue
		}
		if v <= last[string(m.Key)] {
			outOfOrder++
		}
		last[string(m.Key)] = v
	}
	t.Logf("read_committed reads %d records of %d events; read_uncommitted %d (with the sentinel, and what aborted transactions hold)",
		len(got), len(want), uncommitted.len())
	require.Zero(t, dups, "records published twice: the frozen relay's reached the topic")
	require.Zero(t, outOfOrder, "events out of order per purchase")
	require.Len(t, seen, len(want), "every event is on the topic")
}

// bigTargets are fenceTargets targets of an event.
func bigTargets() []event.Target {
	out := make([]event.Target, fenceTargets)
	for i := range out {
		out[i] = catalogtest.Target(event.TargetProject, uuid.New())
	}
	return out
}

// topicReader holds every record a consumer of one isolation level read from
// a topic of one partition since its start.
type topicReader struct {
	mu   sync.Mutex
	recs []*sarama.ConsumerMessage
}

// readAll reads the partition 0 of topic with isolation until the test ends.
func readAll(t *testing.T, topic string, isolation sarama.IsolationLevel) *topicReader {
	t.Helper()
	cfg := kafkatest.Cluster(t).ClientConfig("promoflow-test")
	cfg.Consumer.IsolationLevel = isolation
	consumer, err := sarama.NewConsumer(kafkatest.Brokers(t), cfg)
	require.NoError(t, err)
	pc, err := consumer.ConsumePartition(topic, 0, sarama.OffsetOldest)
	require.NoError(t, err)
	r := &topicReader{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range pc.Messages() {
			r.mu.Lock()
			r.recs = append(r.recs, m)
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		pc.AsyncClose()
		<-done
		_ = consumer.Close()
	})
	return r
}

func (r *topicReader) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs)
}

func (r *topicReader) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := map[string]bool{}
	for _, m := range r.recs {
		ids[kafkatest.Header(m, kafka.UUIDHeaderKey)] = true
	}
	return len(ids)
}

// untilEnd puts a sentinel record on the topic and returns what the reader
// read before it: every record committed before the sentinel.
func (r *topicReader) untilEnd(t *testing.T, topic string) []*sarama.ConsumerMessage {
	t.Helper()
	_, at, err := syncProducer(t, "promoflow-test-sentinel").SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder("sentinel"), Value: sarama.StringEncoder("sentinel")})
	require.NoError(t, err)
	var out []*sarama.ConsumerMessage
	require.Eventually(t, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for i, m := range r.recs {
			if m.Offset == at {
				out = r.recs[:i]
				return true
			}
		}
		return false
	}, time.Minute, 10*time.Millisecond, "the sentinel at offset %d was not read", at)
	return out
}
