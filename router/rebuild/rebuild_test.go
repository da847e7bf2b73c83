package rebuild_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/logtest"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/router/rebuild"
)

func setup(t *testing.T) *catalogtest.Bundle {
	t.Helper()
	t.Parallel()
	return catalogtest.New(t, true)
}

func newRebuilder(t *testing.T, b *catalogtest.Bundle) *rebuild.Rebuilder {
	t.Helper()
	return newRebuilderWith(t, b, rebuild.Config{})
}

// newRebuilderWith is a rebuilder of b with the settings of cfg.
func newRebuilderWith(t *testing.T, b *catalogtest.Bundle, cfg rebuild.Config) *rebuild.Rebuilder {
	t.Helper()
	cfg.DB, cfg.Kafka, cfg.Topic = b.DB, b.Cfg.Kafka, b.Cfg.Topic
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	rb, err := rebuild.New(cfg)
	require.NoError(t, err)
	t.Cleanup(rb.Stop)
	return rb
}

func contributions(t *testing.T, b *catalogtest.Bundle) int {
	t.Helper()
	var n int
	require.NoError(t, b.DB.Get(&n, `SELECT count(*) FROM catalog.promotion_contributions`))
	return n
}

// cards makes two project cards with three objects each (the third
// unpublished) and returns them.
func cards(t *testing.T, b *catalogtest.Bundle) (projects, objects []uuid.UUID) {
	t.Helper()
	for range 2 {
		p := uuid.New()
		b.ProjectCard(t, p)
		projects = append(projects, p)
		for i := range 3 {
			o := uuid.New()
			b.ObjectCard(t, o, p, i < 2)
			objects = append(objects, o)
		}
	}
	return projects, objects
}

// TestCatalog_DeterministicReplayAfterRebuild: a history with activations,
// removals, stale snapshots and redelivered records; the projection is
// corrupted, then rebuilt. The result must equal the model of the events
// sent, and the consumer's dedup marks are left as they were.
func TestCatalog_DeterministicReplayAfterRebuild(t *testing.T) {
	b, h, _, _ := corruptedAfterHistory(t)
	marks := dedupMarks(t, b)

	st, err := newRebuilder(t, b).Run(context.Background())

	require.NoError(t, err)
	require.Equal(t, rebuild.StateDone, st.State)
	require.Equal(t, rebuild.PhaseSwitch, st.Phase)
	require.Equal(t, st.OffsetsTotal, st.OffsetsDone)
	require.EqualValues(t, h.sent(), st.Read)
	require.Zero(t, st.Skipped)
	require.EqualValues(t, 12, st.Purchases)
	require.EqualValues(t, 24, st.Contributions)
	require.Positive(t, st.CatchUps)
	require.EqualValues(t, 1, st.CardsChanged, "the corruption set one card's boost off; the replica rows it changed left the cards as they were")
	requireModel(t, b, h, "after the rebuild")
	require.ElementsMatch(t, marks, dedupMarks(t, b), "the rebuild leaves the consumer's dedup marks as they were")
	requireNoBuildTables(t, b)
}

// TestRebuild_UnderLiveTrafficEndsEqualToTheEventsLatestState: purchases are
// created, expired and cancelled while the rebuild of a corrupted projection
// runs; once both are done, the projection is the model of every event sent.
func TestRebuild_UnderLiveTrafficEndsEqualToTheEventsLatestState(t *testing.T) {
	b := setup(t)
	projects := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	for _, p := range projects {
		b.ProjectCard(t, p)
	}
	b.Start(t)
	h := &history{}
	produce := func(i int) {
		ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 1+i%7, catalogtest.Target(event.TargetProject, projects[i%3]))
		h.produce(t, b, ev)
		if i%2 == 0 {
			ev.Version, ev.Status = 2, []event.Status{event.StatusExpired, event.StatusCancelled}[i%4/2]
			h.produce(t, b, ev)
		}
	}
	for i := range 60 {
		produce(i)
	}
	b.WaitConsumed(t, float64(h.sent()), 30*time.Second)
	corrupt(t, b, h)

	rb := newRebuilder(t, b)
	done := make(chan rebuild.Status, 1)
	go func() {
		st, err := rb.Run(context.Background())
		assert.NoError(t, err)
		done <- st
	}()
	for i := 60; i < 180; i++ {
		produce(i) // live traffic, before, during and after the reset
	}
	st := <-done
	require.Equal(t, rebuild.StateDone, st.State)
	b.WaitConsumed(t, float64(h.sent()), 30*time.Second)
	requireModel(t, b, h, "after the rebuild under live traffic")
}

func TestRebuild_RefusesTruncatedUncompactedTopic(t *testing.T) {
	b := setup(t)
	b.Cfg.Topic = kafkatest.Topic(t, 1) // delete policy, as the broker's default
	project := uuid.New()
	b.ProjectCard(t, project)
	b.Start(t)
	first := catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetProject, project))
	second := catalogtest.PurchaseEvent(event.StatusActive, 1, 5, catalogtest.Target(event.TargetProject, project))
	b.Produce(t, first)
	b.Produce(t, second)
	b.WaitBoost(t, event.TargetProject, project, 15)
	deleteRecords(t, b.Cfg.Topic, 0, 1) // retention removed the first purchase

	_, err := newRebuilder(t, b).Run(context.Background())

	var incomplete *rebuild.IncompleteError
	require.ErrorAs(t, err, &incomplete)
	require.Equal(t, int64(1), incomplete.Earliest)
	require.ErrorContains(t, err, "nothing was changed")
	require.Equal(t, 15, b.BoostOf(event.TargetProject, project), "nothing was wiped")
	require.Equal(t, 2, contributions(t, b))
}

func TestRebuild_OffsetOutOfRangeIsAnErrorNotAPanic(t *testing.T) {
	b := setup(t)
	// Kafka allows DeleteRecords on a delete-policy topic only; the check
	// passes while its earliest offset is still 0.
	b.Cfg.Topic = kafkatest.Topic(t, 1)
	project := uuid.New()
	b.ProjectCard(t, project)
	b.Start(t)
	for i := range 3 {
		// One key: every record in one partition, offsets 0, 1, 2.
		ev := catalogtest.PurchaseEvent(event.StatusActive, int64(i+1), 10, catalogtest.Target(event.TargetProject, project))
		ev.PurchaseId = uuid.MustParse("00000000-0000-4000-8000-00000000000a")
		b.Produce(t, ev)
	}
	b.WaitBoost(t, event.TargetProject, project, 10)
	partition := partitionOf(t, b.Cfg.Topic)

	rb := newRebuilder(t, b)
	rb.SetHook(func(_ context.Context, at rebuild.Point) error {
		if at == rebuild.PointEnds {
			// After the ranges were planned from offset 0: the records before 2 vanish.
			deleteRecords(t, b.Cfg.Topic, partition, 2)
		}
		return nil
	})
	var st rebuild.Status
	var err error
	require.NotPanics(t, func() { st, err = rb.Run(context.Background()) })

	require.ErrorIs(t, err, sarama.ErrOffsetOutOfRange)
	require.ErrorContains(t, err, "removed by retention or DeleteRecords")
	require.Equal(t, rebuild.StateFailed, st.State)
	require.Contains(t, st.Error, "removed by retention or DeleteRecords")
}

func TestRebuild_SecondRebuildWhileOneRunsIsRefused(t *testing.T) {
	b := setup(t)
	b.Start(t)
	b.Produce(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetProject, uuid.New())))
	b.WaitConsumed(t, 1, 30*time.Second)
	release := make(chan struct{})
	first := newRebuilder(t, b)
	first.SetHook(func(ctx context.Context, at rebuild.Point) error {
		if at != rebuild.PointEnds {
			return nil
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	started, err := first.Start(context.Background())
	require.NoError(t, err)
	require.Equal(t, rebuild.StateRunning, started.State)

	_, err = newRebuilder(t, b).Run(context.Background())
	require.ErrorIs(t, err, rebuild.ErrRunning)
	close(release)
	require.Eventually(t, func() bool {
		st, err := first.Status(context.Background())
		return err == nil && st.State == rebuild.StateDone
	}, 30*time.Second, 20*time.Millisecond)
}

// deleteRecords removes the records of partition below offset, as retention would.
func deleteRecords(t *testing.T, topic string, partition int32, below int64) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(kafkatest.Brokers(t), kafkatest.Cluster(t).ClientConfig("promoflow-test"))
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, admin.DeleteRecords(topic, map[int32]int64{partition: below}))
}

// partitionOf is the one partition of topic that holds records.
func partitionOf(t *testing.T, topic string) int32 {
	t.Helper()
	for p, n := range catalogtest.PartitionSizes(t, topic) {
		if n > 0 {
			return p
		}
	}
	t.Fatal("no partition holds records")
	return -1
}

// TestRebuild_LeaseIsTheRunningRow: a running rebuild that writes its
// progress refuses a second one; one whose process stopped writing is taken
// over once stale; and a rebuild whose row was taken over stops.
func TestRebuild_LeaseIsTheRunningRow(t *testing.T) {
	b := setup(t)
	b.Start(t)
	insertRunning := func(age time.Duration) uuid.UUID {
		id := uuid.New()
		_, err := b.DB.Exec(`INSERT INTO catalog.projection_rebuilds (id, state, started_at, updated_at)
			VALUES ($1, 'running', now() - $2::interval, now() - $2::interval)`, id, age.String())
		require.NoError(t, err)
		return id
	}
	fresh := insertRunning(0)
	_, err := newRebuilder(t, b).Run(context.Background())
	require.ErrorIs(t, err, rebuild.ErrRunning, "a running rebuild that writes its progress holds the lease")

	_, err = b.DB.Exec(`UPDATE catalog.projection_rebuilds SET updated_at = now() - interval '1 hour' WHERE id = $1`, fresh)
	require.NoError(t, err)
	st, err := newRebuilder(t, b).Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, rebuild.StateDone, st.State)
	var abandoned rebuild.Status
	require.NoError(t, b.DB.Get(&abandoned, `SELECT state, error FROM catalog.projection_rebuilds WHERE id = $1`, fresh))
	require.Equal(t, rebuild.StateFailed, abandoned.State)
	require.Contains(t, abandoned.Error, "abandoned")

	var logs logtest.Logs
	taken := newRebuilderWith(t, b, rebuild.Config{Log: logs.Logger()})
	taken.SetHook(func(ctx context.Context, at rebuild.Point) error {
		if at != rebuild.PointEnds {
			return nil
		}
		<-ctx.Done()
		return ctx.Err()
	})
	started, err := taken.Start(context.Background())
	require.NoError(t, err)
	_, err = b.DB.Exec(`UPDATE catalog.projection_rebuilds SET state = 'failed' WHERE id = $1`, started.ID)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(logs.Find(slog.LevelError, "projection rebuild failed")) == 1 },
		30*time.Second, 20*time.Millisecond, "the rebuild whose lease was taken stops by itself")
	require.Contains(t, logs.Find(slog.LevelError, "projection rebuild failed")[0]["error"], "rebuild lease lost")
}
