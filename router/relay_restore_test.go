package router_test

import (
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// restoreSetup is a promotion database on cluster A whose transaction ids
// run thousands ahead of those of a fresh cluster B, and B.
type restoreSetup struct {
	a, b  *pgtest.Server
	name  string // the database on A
	onA   promotionBundle
	topic string
}

// xidsBurntOnA is how many transaction ids A uses up before the test writes,
// so that A's outbox rows and position lie far above what B assigns after a
// restore (a restore itself takes a few hundred).
const xidsBurntOnA = 5000

func newRestoreSetup(t *testing.T, partitions int32) restoreSetup {
	t.Helper()
	t.Parallel()
	s := restoreSetup{a: pgtest.StartServer(t, pgtest.ServerOptions{}), b: pgtest.StartServer(t, pgtest.ServerOptions{}),
		topic: kafkatest.Topic(t, partitions)}
	dbURL := pgtest.DatabaseURLOn(t, s.a.URL("sslmode=disable"))
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	s.name = strings.TrimPrefix(u.Path, "/")
	s.onA = promotionBundle{db: pgtest.Open(t, dbURL), topic: s.topic}
	s.onA.db.MustExec(`DO $$ BEGIN FOR i IN 1..` + strconv.Itoa(xidsBurntOnA) + ` LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$`)
	return s
}

// restore copies A's database into B, as pg_dump and psql do, and returns
// B's, unmigrated, as a process on B sees it.
func (s restoreSetup) restore(t *testing.T) promotionBundle {
	t.Helper()
	s.a.CopyDatabase(t, s.name, s.b, "restored")
	onB := promotionBundle{db: s.b.OpenDatabase(t, "restored"), topic: s.topic}
	var xa, xb int64
	require.NoError(t, s.onA.db.Get(&xa, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`))
	require.NoError(t, onB.db.Get(&xb, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`))
	require.Greater(t, xa, xb+xidsBurntOnA/2, "A's transaction ids run far ahead of B's")
	t.Logf("next transaction id: %d on A, %d on B after the restore", xa, xb)
	return onB
}

// requireRebasedOnce checks that the outbox on db was re-based once, onto
// db's cluster.
func requireRebasedOnce(t *testing.T, db *sqlx.DB) {
	t.Helper()
	c, err := outbox.ReadCluster(t.Context(), db)
	require.NoError(t, err)
	var here int64
	require.NoError(t, db.Get(&here, `SELECT system_identifier FROM pg_control_system()`))
	require.Equal(t, here, c.SystemIdentifier, "the outbox records the cluster it runs on")
	require.EqualValues(t, 1, c.Rebases, "the outbox re-based once")
	require.Positive(t, c.XidShift)
}

// versionsOf are version v of each purchase of ids, in transactions of per.
func versionsOf(t *testing.T, ids []uuid.UUID, v int64, per int) [][]*message.Message {
	var txs [][]*message.Message
	for i := 0; i < len(ids); i += per {
		var tx []*message.Message
		for _, id := range ids[i:min(i+per, len(ids))] {
			tx = append(tx, versionMessage(t, id, v, "restore"))
		}
		txs = append(txs, tx)
	}
	return txs
}

func flatten(txs [][]*message.Message) []*message.Message {
	var out []*message.Message
	for _, tx := range txs {
		out = append(out, tx...)
	}
	return out
}

// TestRelay_RestoreIntoAFreshClusterLosesNothing: a relay on cluster A
// publishes every purchase's v1; v2 is written on A after it stopped; the
// database is restored into a fresh cluster B, whose transaction ids lie far
// below A's, a promotion process starts there and v3 is written there. The relay on B publishes every v2 and
// v3, each purchase's versions in order, and its janitor deletes no row
// before it is published; once all is relayed, the janitor empties the outbox.
func TestRelay_RestoreIntoAFreshClusterLosesNothing(t *testing.T) {
	s := newRestoreSetup(t, 3)
	ids := make([]uuid.UUID, 60)
	for i := range ids {
		ids[i] = uuid.New()
	}
	v1, v2, v3 := versionsOf(t, ids, 1, 7), versionsOf(t, ids, 2, 9), versionsOf(t, ids, 3, 11)

	writeOutbox(t, s.onA, v1...)
	stopA := s.onA.startRouter(t, router.PromotionConfig{}, expire.Config{Interval: time.Hour}, slog.New(slog.DiscardHandler))
	readProduced(t, s.topic, uuidsOf(flatten(v1)))
	require.Eventually(t, func() bool {
		st, err := outbox.ReadStats(t.Context(), s.onA.db)
		return err == nil && st.Backlog == 0
	}, time.Minute, 10*time.Millisecond, "the relay on A acks every v1")
	stopA()
	writeOutbox(t, s.onA, v2...)

	onB := s.restore(t)
	published := topicSize(t, s.topic)
	started := time.Now()
	onB.startRouter(t, router.PromotionConfig{}, expire.Config{Interval: time.Hour}, slog.New(slog.DiscardHandler))
	writeOutbox(t, onB, v3...)
	require.Eventually(t, func() bool { return topicSize(t, s.topic) > published }, time.Minute, 5*time.Millisecond,
		"the relay on B publishes the events written after A's relay stopped (nothing new for a minute)")
	t.Logf("the relay on B published its first record %s after it started", time.Since(started).Round(time.Millisecond))

	want := uuidsOf(append(flatten(v2), flatten(v3)...))
	records := readProduced(t, s.topic, want)
	last := map[string]int64{}
	for _, r := range records {
		ev, err := event.Parse(r.Value)
		require.NoError(t, err)
		require.GreaterOrEqual(t, ev.Version, last[string(r.Key)], "purchase %s: v%d at %d/%d follows v%d",
			r.Key, ev.Version, r.Partition, r.Offset, last[string(r.Key)])
		last[string(r.Key)] = ev.Version
	}
	for _, id := range ids {
		require.EqualValues(t, 3, last[id.String()], "purchase %s: its last record is v3", id)
	}
	require.Eventually(t, func() bool {
		var rows int
		return onB.db.Get(&rows, `SELECT count(*) FROM `+outbox.MessagesTable) == nil && rows == 0
	}, time.Minute, 20*time.Millisecond, "the janitor on B deletes the rows its relay published")
	requireRebasedOnce(t, onB.db)
	require.EqualValues(t, 1, testutil.ToFloat64(onB.metrics.OutboxRebased), "the process on B saw the re-base")
}

// TestJanitor_NeverDeletesAnUnpublishedRow: after a restore into a fresh
// cluster, whose transaction ids lie far below the relay's position, the
// janitor deletes none of the rows the relay has not published (those
// written on A after its last ack, and those written on B), however often it
// runs, and the backlog counts every event in them.
func TestJanitor_NeverDeletesAnUnpublishedRow(t *testing.T) {
	s := newRestoreSetup(t, 1)
	ids := make([]uuid.UUID, 20)
	for i := range ids {
		ids[i] = uuid.New()
	}
	writeOutbox(t, s.onA, versionsOf(t, ids, 1, 5)...)
	// The relay's ack of every row so far, as watermill-sql writes it.
	var acked int64
	require.NoError(t, s.onA.db.Get(&acked, `SELECT max("offset") FROM `+outbox.MessagesTable))
	s.onA.db.MustExec(`INSERT INTO `+outbox.OffsetsTable+` (offset_acked, last_processed_transaction_id, consumer_group)
		SELECT "offset", transaction_id, $1 FROM `+outbox.MessagesTable+` WHERE "offset" = $2
		ON CONFLICT (consumer_group) DO UPDATE SET offset_acked = excluded.offset_acked,
			last_processed_transaction_id = excluded.last_processed_transaction_id`, outbox.RelayConsumerGroup, acked)
	v2, v3 := versionsOf(t, ids, 2, 5), versionsOf(t, ids, 3, 4)
	writeOutbox(t, s.onA, v2...)

	onB := s.restore(t)
	writeOutbox(t, onB, v3...)
	unpublished := len(v2) + len(v3)
	events := len(flatten(v2)) + len(flatten(v3))
	for i := range 5 {
		_, err := outbox.Cleanup(t.Context(), onB.db)
		require.NoError(t, err)
		var rows int
		require.NoError(t, onB.db.Get(&rows, `SELECT count(*) FROM `+outbox.MessagesTable+` WHERE "offset" > $1`, acked))
		require.Equal(t, unpublished, rows, "cleanup %d deleted %d of the %d unpublished rows", i+1, unpublished-rows, unpublished)
		st, err := outbox.ReadStats(t.Context(), onB.db)
		require.NoError(t, err)
		require.EqualValues(t, events, st.Backlog, "the backlog counts every unpublished event")
	}
	requireRebasedOnce(t, onB.db)
}
