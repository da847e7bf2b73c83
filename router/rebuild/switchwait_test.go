package rebuild_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/logtest"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/rebuild"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestRebuild_SwitchGivesWayToALongReaderOfTheReplica: a session holds the
// live replica in an open transaction, as an audit does for as long as it
// runs, while a rebuild of a corrupted projection reaches its switch. The
// switch holds the projection's writers back while it waits for the replica,
// so it gives way after its switch wait and tries again, instead of stalling
// the consumer for as long as the reader runs: the consumer applies events
// sent while the reader still holds the replica. Once the reader ends, the
// switch goes through and the projection is the model of every event sent.
func TestRebuild_SwitchGivesWayToALongReaderOfTheReplica(t *testing.T) {
	b, h, projects, objects := corruptedAfterHistory(t)

	reader, err := b.DB.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	defer reader.Rollback() //nolint:errcheck // ended below
	var n int
	require.NoError(t, reader.Get(&n, `SELECT count(*) FROM catalog.promotion_contributions`))

	rb := newRebuilderWith(t, b, rebuild.Config{SwitchWait: 200 * time.Millisecond})
	attempts := make(chan struct{}, 1000)
	rb.SetHook(func(_ context.Context, at rebuild.Point) error {
		if at == rebuild.PointSwitchLocked {
			attempts <- struct{}{}
		}
		return nil
	})
	done := runAsync(rb)

	for i := range 2 {
		select {
		case <-attempts:
		case r := <-done:
			t.Fatalf("the rebuild ended while a reader held the replica: %+v, %v", r.st, r.err)
		case <-time.After(30 * time.Second):
			t.Fatalf("the switch made %d attempt(s) in 30s: it waits for the reader of the replica, "+
				"holding the projection's writers back for as long as the reader runs", i)
		}
	}
	windowEvents(t, b, h, projects[0], objects[0], 77)
	b.WaitConsumed(t, float64(h.sent()), 30*time.Second) // the switch let the consumer through
	select {
	case r := <-done:
		t.Fatalf("the rebuild switched while a reader held the replica: %+v, %v", r.st, r.err)
	default:
	}

	require.NoError(t, reader.Rollback())
	var r runResult
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the rebuild did not switch within 60s of the reader's end")
	}
	require.NoError(t, r.err)
	require.Equal(t, rebuild.StateDone, r.st.State)
	b.WaitConsumed(t, float64(h.sent()), 30*time.Second)
	requireModel(t, b, h, "after a switch that gave way to a reader of the replica")
}

// holdReplica opens a transaction, as application, that reads the live
// replica with statement, and holds it until the test ends or the returned
// release; it returns the session's pid.
func holdReplica(t *testing.T, b *catalogtest.Bundle, application, statement string) (pid int, release func()) {
	t.Helper()
	db := pgtest.Open(t, b.URL+"&application_name="+application)
	reader, err := db.BeginTxx(t.Context(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reader.Rollback() })
	pid = pgtest.BackendPid(t, reader)
	var n int
	require.NoError(t, reader.Get(&n, statement)) // last: pg_stat_activity shows it
	return pid, func() { require.NoError(t, reader.Rollback()) }
}

// gaveWay is the message of a switch that gave way.
const gaveWay = "the switch gave way; the projection's writers go on, and the switch tries again once it caught up"

// TestRebuild_GiveWayLogNamesHoldersNotTheirStatements: a report holds the
// live replica in an open transaction, its statement carrying another team's
// data; the switch that gives way to it logs each holder's pid, application,
// state and time in a transaction, and never its statement.
func TestRebuild_GiveWayLogNamesHoldersNotTheirStatements(t *testing.T) {
	b, h, _, _ := corruptedAfterHistory(t)
	const secret = "tenant 4711 revenue"
	pid, release := holdReplica(t, b, "pf-report", `SELECT count(*) /* `+secret+` */ FROM catalog.promotion_contributions`)
	var logs logtest.Logs
	rb := newRebuilderWith(t, b, rebuild.Config{SwitchWait: 200 * time.Millisecond, Log: logs.Logger()})
	done := runAsync(rb)
	require.Eventually(t, func() bool { return len(logs.Find(slog.LevelWarn, gaveWay)) > 0 }, 30*time.Second,
		10*time.Millisecond, "the switch gives way to the report")
	release()
	require.NoError(t, (<-done).err)
	requireModel(t, b, h, "after the switch that gave way to a report")

	holders := logs.Find(slog.LevelWarn, gaveWay)[0]["holders"]
	require.Contains(t, holders, fmt.Sprintf("pid %d (pf-report), idle in transaction, in a transaction for ", pid))
	for _, rec := range logs.All() {
		require.NotContains(t, rec, secret, "a log of the rebuild copies another session's statement")
	}
}

// TestRebuild_GiveWayReadsCountsAndLogsEachRecordOnce: records arrive while
// the switch holds the writers back (one of them breaking the contract), and
// the switch then gives way, again and again, to a reader of the replica. The
// records it read before giving way stay in the tail: no record is read,
// counted or logged as skipped twice, and the offsets total is the topic's.
func TestRebuild_GiveWayReadsCountsAndLogsEachRecordOnce(t *testing.T) {
	b, h, projects, objects := corruptedAfterHistory(t)
	_, release := holdReplica(t, b, "pf-report", `SELECT count(*) FROM catalog.promotion_contributions`)
	var logs logtest.Logs
	rb := newRebuilderWith(t, b, rebuild.Config{SwitchWait: 200 * time.Millisecond, Log: logs.Logger()})
	attempts := make(chan struct{}, 1000)
	rb.SetHook(func(_ context.Context, at rebuild.Point) error {
		if at != rebuild.PointSwitchLocked {
			return nil
		}
		if len(attempts) == 0 && len(logs.Find(slog.LevelWarn, gaveWay)) == 0 {
			b.ProduceRaw(t, uuid.NewString(), []byte(`{"PurchaseId": "not a purchase"}`))
			windowEvents(t, b, h, projects[0], objects[0], 83)
		}
		attempts <- struct{}{}
		return nil
	})
	done := runAsync(rb)
	require.Eventually(t, func() bool { return len(attempts) >= 3 }, 30*time.Second, 10*time.Millisecond,
		"the switch tries three times while the reader holds the replica")
	release()
	r := <-done
	require.NoError(t, r.err)
	st := r.st

	require.Equal(t, rebuild.StateDone, st.State)
	total := catalogtest.TopicSize(t, b.Cfg.Topic)
	require.Equal(t, total, st.Read, "every record read once")
	require.Equal(t, total, st.OffsetsTotal, "every offset counted once")
	require.Equal(t, st.OffsetsTotal, st.OffsetsDone)
	require.EqualValues(t, 1, st.Skipped, "the record that breaks the contract counted once")
	require.Len(t, logs.Find(slog.LevelWarn, "rebuild skipped a record"), 1, "and logged once")
	b.WaitConsumed(t, float64(h.sent()), 30*time.Second)
	requireModel(t, b, h, "after a switch that gave way three times")
}

// runResult is what a rebuild's Run returned.
type runResult struct {
	st  rebuild.Status
	err error
}

// runAsync runs rb and sends what Run returned.
func runAsync(rb *rebuild.Rebuilder) <-chan runResult {
	done := make(chan runResult, 1)
	go func() {
		st, err := rb.Run(context.Background())
		done <- runResult{st, err}
	}()
	return done
}
