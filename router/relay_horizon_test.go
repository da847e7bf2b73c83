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

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// relayLatencyBound is the most an event may take from its commit to the
// topic while a transaction that writes no outbox row runs.
const relayLatencyBound = 2 * time.Second

// TestRelay_UnrelatedWriterDoesNotHoldEventsBack: a transaction that holds a
// transaction id but writes no outbox row never delays an event: one in
// another database of the server, one on another table of the relay's
// database, one idle in transaction, and a prepared one. Each holds back the
// snapshot's xmin, watermill-sql's horizon, all along.
func TestRelay_UnrelatedWriterDoesNotHoldEventsBack(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartServer(t, pgtest.ServerOptions{Settings: map[string]string{"max_prepared_transactions": "4"}})
	b := promotionBundle{db: pgtest.Open(t, pgtest.DatabaseURLOn(t, srv.URL("sslmode=disable"))), topic: kafkatest.Topic(t, 3)}
	b.start(t, time.Hour)
	other := pgtest.Open(t, pgtest.DatabaseURLOn(t, srv.URL("sslmode=disable")))
	b.db.MustExec(`CREATE TABLE public.neighbour (i int)`)

	cases := []struct {
		name string
		hold func(t *testing.T) (xid int64)
	}{
		{"another database", func(t *testing.T) int64 {
			return holdXid(t, other, `CREATE TEMP TABLE t (i int); INSERT INTO t VALUES (1)`, "SELECT pg_sleep(60)")
		}},
		{"another table of the same database", func(t *testing.T) int64 {
			return holdXid(t, b.db, `INSERT INTO public.neighbour VALUES (1)`, "SELECT pg_sleep(60)")
		}},
		{"idle in transaction", func(t *testing.T) int64 {
			xid := holdXid(t, b.db, `INSERT INTO public.neighbour VALUES (2)`, "")
			var idle int
			require.NoError(t, b.db.Get(&idle, `SELECT count(*) FROM pg_stat_activity
				WHERE state = 'idle in transaction' AND backend_xid::text::bigint = $1`, xid%(1<<32)))
			require.Equal(t, 1, idle, "the neighbour sits idle in its transaction")
			return xid
		}},
		{"prepared transaction", func(t *testing.T) int64 {
			conn, err := other.Connx(t.Context())
			require.NoError(t, err)
			defer conn.Close()
			gid := "neighbour-" + pgtest.RandomSuffix()
			var xid int64
			require.NoError(t, conn.GetContext(t.Context(), &xid, `BEGIN; CREATE TABLE prepared_neighbour (i int);
				SELECT pg_current_xact_id()::text::bigint`))
			_, err = conn.ExecContext(t.Context(), `PREPARE TRANSACTION '`+gid+`'`)
			require.NoError(t, err)
			t.Cleanup(func() { other.MustExec(`ROLLBACK PREPARED '` + gid + `'`) })
			return xid
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			xid := c.hold(t)
			var xmin int64
			require.NoError(t, b.db.Get(&xmin, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint`))
			require.LessOrEqual(t, xmin, xid, "the neighbour holds the snapshot's xmin back")

			msg := versionMessage(t, uuid.New(), 1, "unrelated-writer")
			committed := time.Now()
			writeOutbox(t, b, []*message.Message{msg})
			took := publishDelay(t, b.topic, msg.UUID, committed)
			require.LessOrEqual(t, took, relayLatencyBound, "the event reached the topic %s after its commit while a "+
				"transaction that writes no outbox row (%s, id %d) ran: the relay waits for it", took, c.name, xid)
			t.Logf("%s: the event reached the topic %s after its commit", c.name, took.Round(time.Millisecond))
		})
	}
}

// holdXid runs begin in a transaction of its own on db, so that it holds a
// transaction id, then wait (if any) in the background, and returns the id.
// The transaction ends when the test does.
func holdXid(t testing.TB, db *sqlx.DB, begin, wait string) int64 {
	t.Helper()
	conn, err := db.Connx(context.WithoutCancel(t.Context()))
	require.NoError(t, err)
	var xid, pid int64
	require.NoError(t, conn.GetContext(t.Context(), &xid, `BEGIN; `+begin+`; SELECT pg_current_xact_id()::text::bigint`))
	require.NoError(t, conn.GetContext(t.Context(), &pid, `SELECT pg_backend_pid()`))
	done := make(chan struct{})
	if wait != "" {
		go func() {
			defer close(done)
			_, _ = conn.ExecContext(context.Background(), wait)
		}()
	} else {
		close(done)
	}
	t.Cleanup(func() {
		db.MustExec(`SELECT pg_cancel_backend($1)`, pid)
		<-done
		_, _ = conn.ExecContext(context.Background(), `ROLLBACK`)
		_ = conn.Close()
	})
	return xid
}

// publishDelay is how long after since the record of the message id was
// published (its timestamp, the producer's clock, this machine's), waiting up
// to 10 times relayLatencyBound for it.
func publishDelay(t *testing.T, topic, id string, since time.Time) time.Duration {
	t.Helper()
	records, ok := kafkatest.ReadTopicWithin(t, topic, 10*relayLatencyBound, hasUUIDs(id))
	require.True(t, ok, "the event did not reach the topic within %s of its commit: the relay waits", 10*relayLatencyBound)
	for _, r := range records {
		if kafkatest.Header(r, kafka.UUIDHeaderKey) == id {
			return r.Timestamp.Sub(since)
		}
	}
	panic("unreachable: hasUUIDs found it")
}

// hasUUIDs is a ReadTopic condition: every one of uuids has arrived.
func hasUUIDs(uuids ...string) func([]*sarama.ConsumerMessage) bool {
	return func(ms []*sarama.ConsumerMessage) bool {
		seen := map[string]bool{}
		for _, m := range ms {
			seen[kafkatest.Header(m, kafka.UUIDHeaderKey)] = true
		}
		for _, u := range uuids {
			if !seen[u] {
				return false
			}
		}
		return true
	}
}

// TestRelay_SlowOutboxWriterIsNeverSkipped: an outbox writer whose
// transaction id is older than those of writers that commit before it is
// still relayed once it commits, and after its key's earlier events; the
// relay reads nothing past it meanwhile, and says so in
// promotion_outbox_relay_held_back_seconds.
func TestRelay_SlowOutboxWriterIsNeverSkipped(t *testing.T) {
	b := setupPromotion(t, 3)
	b.start(t, time.Hour)
	ctx := t.Context()
	key := uuid.New()
	v1 := versionMessage(t, key, 1, "slow-writer")
	writeOutbox(t, b, []*message.Message{v1})

	// The slow writer takes its id first, writes its outbox row last.
	slow, err := outbox.BeginTx(ctx, b.db, nil)
	require.NoError(t, err)
	defer slow.Rollback() //nolint:errcheck // no-op after commit
	_, err = slow.ExecContext(ctx, `CREATE TEMP TABLE slow_writer (i int); INSERT INTO slow_writer VALUES (1)`)
	require.NoError(t, err)
	later := purchaseEvents(t, 4, "slow-writer")
	for _, m := range later {
		writeOutbox(t, b, []*message.Message{m})
	}
	waitRelayReads(t, b.db, 3)
	require.Eventually(t, func() bool { return testutil.ToFloat64(b.metrics.OutboxHeldBack) > 0 },
		10*time.Second, 20*time.Millisecond, "promotion_outbox_relay_held_back_seconds names the slow writer")

	v2 := versionMessage(t, key, 2, "slow-writer")
	require.NoError(t, outbox.PublishTx(slow, b.topic, v2))
	require.NoError(t, slow.Commit())
	v3 := versionMessage(t, key, 3, "slow-writer")
	writeOutbox(t, b, []*message.Message{v3})

	all := append([]*message.Message{v1, v2, v3}, later...)
	records, ok := kafkatest.ReadTopicWithin(t, b.topic, 30*time.Second, hasUUIDs(uuidsOf(all)...))
	require.True(t, ok, "missing from the topic: %s (the slow writer's is %s: the relay passed over it)",
		missingUUIDs(records, all), v2.UUID)
	var versions []int64
	for _, r := range records {
		if string(r.Key) != key.String() {
			continue
		}
		ev, err := event.Parse(r.Value)
		require.NoError(t, err)
		versions = append(versions, ev.Version)
	}
	require.Equal(t, []int64{1, 2, 3}, versions, "the key's versions in offset order")
}

// waitRelayReads waits until the relay has read the outbox n times more
// (each read that takes the position records its id in
// promotion.outbox_relay_holder): the last of them began after this call.
func waitRelayReads(t *testing.T, db *sqlx.DB, n int) {
	t.Helper()
	var last int64
	require.NoError(t, db.Get(&last, `SELECT last_value FROM promotion.outbox_relay_holder`))
	for i := range n {
		require.Eventually(t, func() bool {
			var v int64
			require.NoError(t, db.Get(&v, `SELECT last_value FROM promotion.outbox_relay_holder`))
			if v == last {
				return false
			}
			last = v
			return true
		}, 10*time.Second, 5*time.Millisecond, "the relay's read %d of %d", i+1, n)
	}
}

// missingUUIDs names the messages of want that records lack.
func missingUUIDs(records []*sarama.ConsumerMessage, want []*message.Message) string {
	seen := map[string]bool{}
	for _, r := range records {
		seen[kafkatest.Header(r, kafka.UUIDHeaderKey)] = true
	}
	var missing []string
	for _, m := range want {
		if !seen[m.UUID] {
			missing = append(missing, m.UUID)
		}
	}
	return fmt.Sprintf("%d of %d [%s]", len(missing), len(want), strings.Join(missing, " "))
}
