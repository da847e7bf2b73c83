package expire_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/logtest"
	"github.com/promoflow/promoflow/handlers/purchase"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

type bundle struct {
	db   *sqlx.DB
	logs *logtest.Logs
	exp  *expire.Expirer
}

func setup(t *testing.T, cfg expire.Config) bundle {
	t.Helper()
	t.Parallel()
	db := pgtest.DB(t)
	logs := &logtest.Logs{}
	exp, err := expire.New(db, cfg, logs.Logger())
	require.NoError(t, err)
	return bundle{db: db, logs: logs, exp: exp}
}

// eventsByPurchase counts outbox events per purchase and status.
func eventsByPurchase(t *testing.T, db *sqlx.DB) map[uuid.UUID][]event.PurchaseChanged {
	out := map[uuid.UUID][]event.PurchaseChanged{}
	for _, ev := range purchasetest.OutboxEvents(t, db) {
		out[ev.PurchaseId] = append(out[ev.PurchaseId], ev)
	}
	return out
}

func TestExpirer_EmptyBatchIsNoOp(t *testing.T) {
	b := setup(t, expire.Config{})
	future := purchasetest.SeedActive(t, b.db, 3, time.Now().Add(time.Hour))

	res, err := b.exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.Zero(t, res.ExpiredCount)
	require.Zero(t, res.Backlog)
	require.Equal(t, 1, res.Batches)
	require.Empty(t, purchasetest.OutboxEvents(t, b.db))
	for _, id := range future {
		require.Equal(t, purchasetest.State{Status: event.StatusActive, Version: 1}, purchasetest.Statuses(t, b.db)[id])
	}
}

func TestExpirer_DuePurchaseBecomesExpiredWithOneEvent(t *testing.T) {
	b := setup(t, expire.Config{})
	due := purchasetest.SeedActive(t, b.db, 3, time.Now().Add(-time.Minute))
	notYet := purchasetest.SeedActive(t, b.db, 1, time.Now().Add(time.Hour))[0]

	res, err := b.exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, res.ExpiredCount)

	states := purchasetest.Statuses(t, b.db)
	events := eventsByPurchase(t, b.db)
	for _, id := range due {
		require.Equal(t, purchasetest.State{Status: event.StatusExpired, Version: 2}, states[id])
		require.Len(t, events[id], 1)
		require.Equal(t, event.StatusExpired, events[id][0].Status)
		require.EqualValues(t, 2, events[id][0].Version)
	}
	require.Equal(t, event.StatusActive, states[notYet].Status)
	require.Empty(t, events[notYet])

	var updatedAt time.Time
	require.NoError(t, b.db.Get(&updatedAt, `SELECT updated_at FROM promotion.promotion_purchases WHERE id = $1`, due[0]))
	require.WithinDuration(t, res.AsOf, updatedAt, time.Millisecond, "UpdatedAt = AsOf")
	require.Len(t, b.logs.Find(slog.LevelInfo, "promotion expired"), 3)

	again, err := b.exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.Zero(t, again.ExpiredCount, "a terminal purchase is never selected again (INV-6)")
}

func TestExpirer_ResultCarriesTheDelayPastEndsAtOfEachExpiredPurchase(t *testing.T) {
	b := setup(t, expire.Config{BatchSize: 2})
	endsAt := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	purchasetest.SeedActive(t, b.db, 3, endsAt)
	purchasetest.SeedActive(t, b.db, 1, time.Now().Add(time.Hour))

	res, err := b.exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.Len(t, res.Delays, 3, "one per expired purchase, over every batch")
	for _, d := range res.Delays {
		require.Equal(t, res.AsOf.Sub(endsAt), d, "AsOf - EndsAt")
	}
}

func TestExpirer_PoisonRowIsLeftOutAndDoesNotStarveHealthyRows(t *testing.T) {
	b := setup(t, expire.Config{BatchSize: 2})
	// Poison rows come first in EndsAt order and fill whole batches.
	poison := purchasetest.SeedActive(t, b.db, 3, time.Now().Add(-time.Hour))
	_, err := b.db.Exec(`UPDATE promotion.promotion_purchases SET targets = '{"not":"an array"}' WHERE id = ANY($1::uuid[])`,
		pqArray(poison))
	require.NoError(t, err)
	healthy := purchasetest.SeedActive(t, b.db, 5, time.Now().Add(-time.Minute))

	res, err := b.exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.Equal(t, 5, res.ExpiredCount)
	require.Equal(t, 3, res.PoisonCount)
	require.Equal(t, 3, res.Backlog, "poison rows stay Active for the next cycle")

	states := purchasetest.Statuses(t, b.db)
	for _, id := range healthy {
		require.Equal(t, event.StatusExpired, states[id].Status)
	}
	failed := b.logs.Find(slog.LevelError, "item failed")
	require.Len(t, failed, 3)
	logged := map[string]bool{}
	for _, f := range failed {
		logged[f["PurchaseId"]] = true
	}
	for _, id := range poison {
		require.Equal(t, purchasetest.State{Status: event.StatusActive, Version: 1}, states[id])
		require.True(t, logged[id.String()], "ERROR log names the poison PurchaseId")
	}
	require.Len(t, purchasetest.OutboxEvents(t, b.db), 5)

	next, err := b.exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, next.PoisonCount, "poison is tried again next cycle")
}

// TestExpirer_RowWithFailingSQLIsPoisonAndDoesNotStarve: a row that passes
// the aggregate's checks but whose transition SQL fails (version + 1
// overflows bigint) is isolated within its batch, logged and counted as
// poison; the healthy rows of the same batch and behind it commit.
func TestExpirer_RowWithFailingSQLIsPoisonAndDoesNotStarve(t *testing.T) {
	b := setup(t, expire.Config{BatchSize: 4})
	poison := purchasetest.SeedActive(t, b.db, 3, time.Now().Add(-time.Hour))
	_, err := b.db.Exec(`UPDATE promotion.promotion_purchases SET version = 9223372036854775807 WHERE id = ANY($1::uuid[])`,
		pqArray(poison))
	require.NoError(t, err)
	healthy := purchasetest.SeedActive(t, b.db, 5, time.Now().Add(-time.Minute))

	res, err := b.exp.RunCycle(context.Background())

	require.NoError(t, err, "a row's own SQL error does not fail the batch")
	require.Equal(t, 5, res.ExpiredCount)
	require.Equal(t, 3, res.PoisonCount)
	require.Equal(t, 3, res.Backlog)
	states := purchasetest.Statuses(t, b.db)
	for _, id := range healthy {
		require.Equal(t, purchasetest.State{Status: event.StatusExpired, Version: 2}, states[id])
	}
	for _, id := range poison {
		require.Equal(t, purchasetest.State{Status: event.StatusActive, Version: 9223372036854775807}, states[id])
	}
	failed := b.logs.Find(slog.LevelError, "item failed")
	require.Len(t, failed, 3)
	for _, f := range failed {
		require.Contains(t, f["exception"], "out of range")
	}
	require.Len(t, purchasetest.OutboxEvents(t, b.db), 5, "no event for a poison row")

	more := purchasetest.SeedActive(t, b.db, 2, time.Now().Add(-time.Second))
	next, err := b.exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, next.PoisonCount, "poison is tried again next cycle")
	require.Equal(t, 2, next.ExpiredCount, "and never starves the rows behind it")
	for _, id := range more {
		require.Equal(t, event.StatusExpired, purchasetest.Statuses(t, b.db)[id].Status)
	}
}

func TestExpirer_ParallelInstancesExpireEachPurchaseOnceWithOneEvent(t *testing.T) {
	b := setup(t, expire.Config{BatchSize: 50})
	due := purchasetest.SeedActive(t, b.db, 2000, time.Now().Add(-time.Minute))

	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for range 4 {
		exp, err := expire.New(b.db, expire.Config{BatchSize: 50}, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				res, err := exp.RunCycle(context.Background())
				if !assertNoError(t, err) {
					return
				}
				mu.Lock()
				total += res.ExpiredCount
				mu.Unlock()
				if res.Backlog == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, len(due), total, "the counts of all instances add up to one per purchase")

	states := purchasetest.Statuses(t, b.db)
	events := eventsByPurchase(t, b.db)
	for _, id := range due {
		require.Equal(t, purchasetest.State{Status: event.StatusExpired, Version: 2}, states[id])
		require.Len(t, events[id], 1, "exactly one event for %s", id)
	}
}

// raceRoundsMax bounds the rounds a race test runs until both sides won.
const raceRoundsMax = 10

// TestExpirer_CancelRaceEndsInOneTerminalTransitionAndOneEvent: managers
// cancel due purchases while cycles expire them. Whoever wins, each purchase
// ends with one terminal transition and one event. Rounds of fresh purchases
// run until each side won at least one purchase (at most raceRoundsMax), so
// that the race really happened.
func TestExpirer_CancelRaceEndsInOneTerminalTransitionAndOneEvent(t *testing.T) {
	b := setup(t, expire.Config{BatchSize: 20})
	svc := purchasetest.NewService(t, b.db, "")
	var cancelWins, expireWins, skippedLocked int
	for round := 0; round < raceRoundsMax && (cancelWins == 0 || expireWins == 0); round++ {
		c, e, s := cancelRaceRound(t, b, svc)
		cancelWins, expireWins, skippedLocked = cancelWins+c, expireWins+e, skippedLocked+s
		t.Logf("round %d: cancel won %d, expirer won %d, rows skipped locked %d", round, c, e, s)
	}
	require.Positive(t, cancelWins, "no cancel won a purchase in %d rounds: the race never happened", raceRoundsMax)
	require.Positive(t, expireWins, "the expirer won no purchase in %d rounds: the race never happened", raceRoundsMax)
}

// cancelRaceRound races four cancellers against expiry cycles over 300 due
// purchases of a new tenant, checks every purchase's outcome, and returns how
// many each side won and how many rows the cycles skipped locked.
func cancelRaceRound(t *testing.T, b bundle, svc *purchase.Service) (cancelWins, expireWins, skippedLocked int) {
	t.Helper()
	due := purchasetest.SeedActive(t, b.db, 300, time.Now().Add(-time.Minute))
	var tenant uuid.UUID
	require.NoError(t, b.db.Get(&tenant, `SELECT tenant_id FROM promotion.promotion_purchases WHERE id = $1`, due[0]))

	var wg sync.WaitGroup
	cancelled := make(chan uuid.UUID, len(due))
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < len(due); i += 4 {
				_, err := svc.Cancel(context.Background(), tenant, due[i], "test")
				if err == nil {
					cancelled <- due[i]
				} else if !errors.Is(err, purchase.ErrTerminal) {
					assertNoError(t, err)
				}
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			res, err := b.exp.RunCycle(context.Background())
			if !assertNoError(t, err) {
				return
			}
			skippedLocked += res.SkippedLockedCount
			if res.Backlog == 0 {
				return
			}
		}
	})
	wg.Wait()
	close(cancelled)
	wonByCancel := map[uuid.UUID]bool{}
	for id := range cancelled {
		wonByCancel[id] = true
	}

	states := purchasetest.Statuses(t, b.db)
	events := eventsByPurchase(t, b.db)
	for _, id := range due {
		st := states[id]
		require.True(t, st.Status.Terminal(), "%s ends terminal", id)
		require.EqualValues(t, 2, st.Version, "%s has exactly one transition", id)
		require.Len(t, events[id], 1, "%s has exactly one event", id)
		require.Equal(t, st.Status, events[id][0].Status)
		require.Equal(t, wonByCancel[id], st.Status == event.StatusCancelled)
		if wonByCancel[id] {
			cancelWins++
		} else {
			expireWins++
		}
	}
	return cancelWins, expireWins, skippedLocked
}

func TestExpirer_RowHeldByCancelIsSkippedLocked(t *testing.T) {
	b := setup(t, expire.Config{})
	ids := purchasetest.SeedActive(t, b.db, 2, time.Now().Add(-time.Minute))
	var tenant uuid.UUID
	require.NoError(t, b.db.Get(&tenant, `SELECT tenant_id FROM promotion.promotion_purchases LIMIT 1`))

	// A manager's cancel holds the row lock while the cycle runs.
	tx, err := b.db.Beginx()
	require.NoError(t, err)
	p, err := purchase.LockTx(context.Background(), tx, tenant, ids[0])
	require.NoError(t, err)

	res, err := b.exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, res.ExpiredCount)
	require.Equal(t, 1, res.SkippedLockedCount)

	require.NoError(t, p.Cancel(time.Now()))
	require.NoError(t, purchase.SaveTransitionTx(context.Background(), tx, p))
	require.NoError(t, tx.Commit())

	res, err = b.exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.Zero(t, res.ExpiredCount, "the cancelled purchase is out of the selection")
	require.Equal(t, event.StatusCancelled, purchasetest.Statuses(t, b.db)[ids[0]].Status)
}

func TestExpirer_CancellationMidCycleCommitsOrRollsBackWholeBatches(t *testing.T) {
	b := setup(t, expire.Config{BatchSize: 100})
	due := purchasetest.SeedActive(t, b.db, 5000, time.Now().Add(-time.Minute))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan expire.Result, 1)
	go func() {
		res, err := b.exp.RunCycle(ctx)
		assertNoError(t, err)
		done <- res
	}()
	require.Eventually(t, func() bool {
		var n int
		_ = b.db.Get(&n, `SELECT count(*) FROM promotion.promotion_purchases WHERE status = 'Expired'`)
		return n > 0
	}, 30*time.Second, 5*time.Millisecond)
	cancel()
	res := <-done
	require.True(t, res.Interrupted, "the cycle stopped before draining 5000 rows")

	states := purchasetest.Statuses(t, b.db)
	events := eventsByPurchase(t, b.db)
	expired := 0
	for _, id := range due {
		switch states[id].Status {
		case event.StatusExpired:
			expired++
			require.Len(t, events[id], 1)
		case event.StatusActive:
			require.Empty(t, events[id])
		default:
			t.Fatalf("unexpected status %s", states[id].Status)
		}
	}
	require.Equal(t, res.ExpiredCount, expired)
	require.Zero(t, expired%100, "only whole batches committed")
	require.Less(t, expired, len(due))

	// No row lock survives: every row can be locked without waiting.
	tx, err := b.db.Beginx()
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck
	_, err = tx.Exec(`SELECT id FROM promotion.promotion_purchases FOR UPDATE NOWAIT`)
	require.NoError(t, err)
}

func TestExpirer_InfrastructureErrorRollsBackTheBatch(t *testing.T) {
	b := setup(t, expire.Config{})
	due := purchasetest.SeedActive(t, b.db, 10, time.Now().Add(-time.Minute))

	// The outbox write fails: the transitions of the batch must not stay.
	_, err := b.db.Exec(`ALTER TABLE promotion.outbox_messages RENAME TO outbox_messages_away`)
	require.NoError(t, err)
	_, err = b.exp.RunCycle(context.Background())
	require.Error(t, err)
	for _, id := range due {
		require.Equal(t, purchasetest.State{Status: event.StatusActive, Version: 1}, purchasetest.Statuses(t, b.db)[id])
	}

	_, err = b.db.Exec(`ALTER TABLE promotion.outbox_messages_away RENAME TO outbox_messages`)
	require.NoError(t, err)
	res, err := b.exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.Equal(t, 10, res.ExpiredCount, "the next cycle retries the same rows")
	require.Len(t, purchasetest.OutboxEvents(t, b.db), 10)
}

func TestExpirer_DrainsBacklogInBatchesWithinOneCycle(t *testing.T) {
	b := setup(t, expire.Config{BatchSize: 200})
	purchasetest.SeedActive(t, b.db, 1000, time.Now().Add(-time.Minute))
	res, err := b.exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1000, res.ExpiredCount)
	// Five full batches, and one that finds the backlog empty for each batch
	// that was running beside it then.
	require.GreaterOrEqual(t, res.Batches, 6)
	require.LessOrEqual(t, res.Batches, 5+expire.ConcurrencyDefault)
	require.Zero(t, res.Backlog)
	require.False(t, res.Cut, "the cycle drained the backlog")
}

func TestExpirer_MaxDurationEndsTheCycle(t *testing.T) {
	b := setup(t, expire.Config{BatchSize: 1, MaxDuration: time.Nanosecond})
	purchasetest.SeedActive(t, b.db, 5, time.Now().Add(-time.Minute))
	res, err := b.exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, res.Batches, "a cycle takes one batch at least, and no more once MaxDuration is spent")
	require.Equal(t, 1, res.ExpiredCount)
	require.Equal(t, 4, res.Backlog, "what is left waits for the next cycle")
	require.True(t, res.Cut, "MaxDuration ended the cycle")
}

// TestExpirer_ACycleThatSpendsMaxDurationIsCut: a cycle whose batches come
// back full until MaxDuration is spent says so (Cut), with the rest due; the
// process then runs the next cycle at once (Wakeup.After).
func TestExpirer_ACycleThatSpendsMaxDurationIsCut(t *testing.T) {
	b := setup(t, expire.Config{BatchSize: 1, MaxDuration: 10 * time.Millisecond})
	purchasetest.SeedActive(t, b.db, 4, time.Now().Add(-time.Minute))
	pgtest.SlowUpdates(t, b.db, "promotion.promotion_purchases", 50*time.Millisecond)

	res, err := b.exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.True(t, res.Cut, "the first batch outlasted MaxDuration")
	require.GreaterOrEqual(t, res.ExpiredCount, 1)
	require.Equal(t, 4-res.ExpiredCount, res.Backlog)
}

// TestExpirer_ACyclesBatchesRunSideBySide: once a full batch shows a backlog,
// Concurrency batch transactions of one cycle run at once on disjoint rows.
// The second UPDATE statement waits until a third has begun (a statement
// trigger counts them on a sequence, which no transaction hides), so a cycle
// that ran its batches one at a time fails that wait.
func TestExpirer_ACyclesBatchesRunSideBySide(t *testing.T) {
	b := setup(t, expire.Config{BatchSize: 1, Concurrency: 2})
	due := purchasetest.SeedActive(t, b.db, 6, time.Now().Add(-time.Minute))
	b.db.MustExec(`CREATE SEQUENCE promotion.update_barrier`)
	b.db.MustExec(`CREATE FUNCTION promotion.update_barrier() RETURNS trigger LANGUAGE plpgsql AS $$
		DECLARE waited int := 0;
		BEGIN
			-- The first batch runs alone (it shows the backlog); the second
			-- statement waits for the third.
			IF nextval('promotion.update_barrier') <> 2 THEN RETURN NULL; END IF;
			WHILE (SELECT last_value FROM promotion.update_barrier) < 3 LOOP
				waited := waited + 1;
				IF waited > 1000 THEN
					RAISE EXCEPTION 'no other expirer batch reached its UPDATE within 10s: the batches ran one at a time';
				END IF;
				PERFORM pg_sleep(0.01);
			END LOOP;
			RETURN NULL;
		END $$`)
	b.db.MustExec(`CREATE TRIGGER update_barrier AFTER UPDATE ON promotion.promotion_purchases
		FOR EACH STATEMENT EXECUTE FUNCTION promotion.update_barrier()`)

	res, err := b.exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.Equal(t, 6, res.ExpiredCount)
	events := eventsByPurchase(t, b.db)
	for _, id := range due {
		require.Len(t, events[id], 1, "one event for %s", id)
	}
}

func TestConfig_ValidateListsEveryProblem(t *testing.T) {
	_, err := expire.New(nil, expire.Config{BatchSize: -1, MaxDuration: -1, BatchTimeout: -1, WakeupPoll: -1, Concurrency: 17},
		slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "batch size")
	require.ErrorContains(t, err, "concurrency")
	require.ErrorContains(t, err, "max duration")
	require.ErrorContains(t, err, "batch timeout")
	require.ErrorContains(t, err, "wake-up poll")
}

func assertNoError(t *testing.T, err error) bool {
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}
