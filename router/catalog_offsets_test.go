package router_test

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/nettest"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestCatalog_OffsetsLiveWithTheProjection: the catalog database fails over
// to a standby that missed the consumer's last transactions, while Kafka's
// committed offsets already passed them. The consumer, started on the
// promoted standby, goes back to the offsets the database kept and applies
// again what the database lost: every card equals a recompute from every
// event, and every purchase's replica is at its last version.
func TestCatalog_OffsetsLiveWithTheProjection(t *testing.T) {
	t.Parallel()
	primary := pgtest.StartServer(t, pgtest.ServerOptions{})
	b := catalogtest.NewOn(t, primary.URL("sslmode=disable"), true)
	cards := make([]uuid.UUID, 6)
	for i := range cards {
		cards[i] = uuid.New()
		b.ProjectCard(t, cards[i])
	}
	standby := primary.StartStandby(t, "catalog-standby")
	stop := b.Start(t)

	// Every event produced, by purchase; the last one of each is its state.
	last := map[uuid.UUID]event.PurchaseChanged{}
	produce := func(ev event.PurchaseChanged) {
		b.Produce(t, ev)
		last[ev.PurchaseId] = ev
	}
	expected := func() map[uuid.UUID]int { return boostsOf(cards, last) }
	var before []event.PurchaseChanged
	for i := range 24 {
		ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 1+i%7, catalogtest.Target(event.TargetProject, cards[i%len(cards)]))
		produce(ev)
		before = append(before, ev)
	}
	require.Eventually(t, func() bool { return equalBoosts(b.CardBoosts(t), expected()) }, 30*time.Second, 20*time.Millisecond,
		"the consumer applies the first events")
	primary.WaitReplayed(t, standby)

	// The standby stops following: what the consumer applies from now on is
	// on the primary only, and Kafka's committed offsets pass it.
	standby.Detach(t)
	for i, ev := range before {
		switch i % 3 {
		case 0:
			ev.Status, ev.Version = event.StatusCancelled, 2
		case 1:
			ev.BoostWeight, ev.Version = ev.BoostWeight+40, 2
		default:
			continue
		}
		produce(ev)
	}
	for i := range 12 {
		produce(catalogtest.PurchaseEvent(event.StatusActive, 1, 50+i, catalogtest.Target(event.TargetProject, cards[i%len(cards)])))
	}
	want := expected()
	require.Eventually(t, func() bool { return equalBoosts(b.CardBoosts(t), want) }, 30*time.Second, 20*time.Millisecond,
		"the consumer applies the later events on the primary")
	waitLagZero(t, b.Cfg.ConsumerGroup, b.Cfg.Topic)
	stop()

	// The primary's machine dies; the standby, which missed the later
	// events, becomes the catalog database.
	primary.Kill(t)
	standby.Promote(t)
	promoted := &catalogtest.Bundle{DB: pgtest.Open(t, standby.URL("sslmode=disable")), Cfg: b.Cfg, Pub: b.Pub}
	require.False(t, equalBoosts(promoted.CardBoosts(t), want), "the promoted standby misses the later events")

	promoted.Start(t)
	require.Eventually(t, func() bool { return equalBoosts(promoted.CardBoosts(t), want) }, 30*time.Second, 50*time.Millisecond,
		"every card equals a recompute from every event once the consumer runs on the promoted standby: want %v, have %v",
		want, promoted.CardBoosts(t))
	for id, ev := range last {
		var version int64
		require.NoError(t, promoted.DB.Get(&version, `SELECT coalesce(max(version), 0) FROM catalog.promotion_contributions
			WHERE purchase_id = $1`, id))
		require.Equal(t, ev.Version, version, "purchase %s: the replica holds its last event", id)
	}
}

// equalBoosts reports whether every card of want has its boost in have.
func equalBoosts(have, want map[uuid.UUID]int) bool {
	for id, boost := range want {
		if have[id] != boost {
			return false
		}
	}
	return true
}

// TestCatalog_OffsetRowCommitsOrRollsBackWithTheProjection: the offset row
// is written in the transaction that applies the record: while writing it
// fails, the record's contribution, its card's boost and its dedup mark are
// not committed either; once it succeeds, all of them are, the row at the
// offset after the record.
func TestCatalog_OffsetRowCommitsOrRollsBackWithTheProjection(t *testing.T) {
	b := setupCatalog(t, true)
	project := uuid.New()
	b.ProjectCard(t, project)
	_, err := b.DB.Exec(`
		CREATE TABLE public.offsets_refused (refuse boolean);
		INSERT INTO public.offsets_refused VALUES (true);
		CREATE SEQUENCE public.offsets_attempts;
		CREATE FUNCTION public.refuse_offsets() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			PERFORM nextval('public.offsets_attempts'); -- not transactional: counts the attempts
			IF EXISTS (SELECT 1 FROM public.offsets_refused) THEN
				RAISE EXCEPTION 'offsets refused by the test';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON catalog.consumer_offsets
			FOR EACH ROW EXECUTE FUNCTION public.refuse_offsets()`)
	require.NoError(t, err)
	b.Start(t)

	msg := b.Produce(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 30, catalogtest.Target(event.TargetProject, project)))
	require.Eventually(t, func() bool {
		var attempts int64
		require.NoError(t, b.DB.Get(&attempts, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM public.offsets_attempts`))
		return attempts >= 3
	}, 30*time.Second, 10*time.Millisecond, "the consumer tries to store the record's offset")
	count := func(query string, args ...any) int {
		var n int
		require.NoError(t, b.DB.Get(&n, query, args...))
		return n
	}
	require.Zero(t, count(`SELECT count(*) FROM catalog.promotion_contributions`),
		"a transaction whose offset row failed committed its contribution")
	require.Zero(t, count(`SELECT count(*) FROM catalog.processed_messages`), "nor its dedup mark")
	require.Zero(t, b.BoostOf(event.TargetProject, project), "nor its card's boost")

	_, err = b.DB.Exec(`DELETE FROM public.offsets_refused`)
	require.NoError(t, err)
	b.WaitBoost(t, event.TargetProject, project, 30)
	require.Equal(t, 1, count(`SELECT count(*) FROM catalog.processed_messages WHERE key LIKE '%' || $1`, msg.UUID))
	ends := catalogtest.PartitionSizes(t, b.Cfg.Topic)
	var rows []struct {
		Partition int32 `db:"partition"`
		Next      int64 `db:"next_offset"`
	}
	require.NoError(t, b.DB.Select(&rows, `SELECT partition, max(next_offset) AS next_offset
		FROM catalog.consumer_offsets WHERE topic = $1 GROUP BY partition`, b.Cfg.Topic))
	require.Len(t, rows, 1, "rows for the record's partition only")
	require.Equal(t, ends[rows[0].Partition], rows[0].Next, "the row is at the offset after the record")
}

// TestCatalog_RunningConsumerReplaysWhatItsDatabaseLost: the catalog
// database fails over to a standby that missed the consumer's last
// transactions while the consumer keeps running, its consumer group session
// alive, reaching the promoted standby at the same address. It finds the
// offsets behind what it had committed, by its first transaction there (with
// traffic after the failover) or by its periodic check (a quiet topic); it
// ends its session, seeks to what the database holds and applies again what
// the database lost: every card equals a recompute from every event.
func TestCatalog_RunningConsumerReplaysWhatItsDatabaseLost(t *testing.T) {
	t.Parallel()
	for name, n := range map[string]struct{ before, after int }{"traffic after the failover": {24, 30},
		"quiet after the failover": {24, 0}, "no offsets stored before the failover": {0, 30}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			replaysWhatTheDatabaseLost(t, n.before, n.after)
		})
	}
}

// replaysWhatTheDatabaseLost runs the failover of
// TestCatalog_RunningConsumerReplaysWhatItsDatabaseLost, with before events
// applied on both servers and after events produced once the standby took
// over.
func replaysWhatTheDatabaseLost(t *testing.T, before, after int) {
	primary := pgtest.StartServer(t, pgtest.ServerOptions{})
	proxy, err := nettest.NewProxy("127.0.0.1:0", fmt.Sprintf("%s:%d", primary.Host, primary.Port))
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	b := catalogtest.NewOn(t, "postgres://postgres@"+proxy.Addr()+"/postgres?sslmode=disable", true)
	cards := make([]uuid.UUID, 6)
	for i := range cards {
		cards[i] = uuid.New()
		b.ProjectCard(t, cards[i])
	}
	standby := primary.StartStandby(t, "catalog-standby")
	b.Start(t)

	last := map[uuid.UUID]event.PurchaseChanged{}
	produce := func(ev event.PurchaseChanged) {
		b.Produce(t, ev)
		last[ev.PurchaseId] = ev
	}
	expected := func() map[uuid.UUID]int { return boostsOf(cards, last) }
	for i := range before {
		produce(catalogtest.PurchaseEvent(event.StatusActive, 1, 1+i%7, catalogtest.Target(event.TargetProject, cards[i%len(cards)])))
	}
	require.Eventually(t, func() bool { return equalBoosts(b.CardBoosts(t), expected()) }, 30*time.Second, 20*time.Millisecond,
		"the consumer applies the first events")
	primary.WaitReplayed(t, standby)

	// What the consumer applies from now on is on the primary only.
	standby.Detach(t)
	for id, ev := range maps.Clone(last) {
		ev.BoostWeight, ev.Version = ev.BoostWeight+40, 2
		if id[0]%2 == 0 {
			ev.Status = event.StatusCancelled
		}
		produce(ev)
	}
	for i := range 12 {
		produce(catalogtest.PurchaseEvent(event.StatusActive, 1, 20+i, catalogtest.Target(event.TargetProject, cards[i%len(cards)])))
	}
	require.Eventually(t, func() bool { return equalBoosts(b.CardBoosts(t), expected()) }, 30*time.Second, 20*time.Millisecond,
		"the consumer applies the later events on the primary")
	waitLagZero(t, b.Cfg.ConsumerGroup, b.Cfg.Topic)

	// The primary dies; the standby takes its address. The consumer runs on.
	primary.Kill(t)
	standby.Promote(t)
	proxy.Redirect(fmt.Sprintf("%s:%d", standby.Host, standby.Port))
	for i := range after {
		produce(catalogtest.PurchaseEvent(event.StatusActive, 1, 50+i, catalogtest.Target(event.TargetProject, cards[i%len(cards)])))
	}
	want := expected()
	require.Eventually(t, func() bool { return equalBoosts(b.CardBoosts(t), want) }, time.Minute, 50*time.Millisecond,
		"every card equals a recompute from every event, what the failover lost applied again: want %v, have %v",
		want, b.CardBoosts(t))
}

// boostsOf is each card's boost that the last event of each purchase implies.
func boostsOf(cards []uuid.UUID, last map[uuid.UUID]event.PurchaseChanged) map[uuid.UUID]int {
	want := map[uuid.UUID]int{}
	for _, c := range cards {
		want[c] = 0
	}
	for _, ev := range last {
		if ev.Status == event.StatusActive {
			for _, tg := range ev.Targets {
				want[tg.TargetId] += ev.BoostWeight
			}
		}
	}
	return want
}
