package middleware_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/middleware"
)

// batchRecorder is an ApplyFunc over message ids that writes each id's
// effect, records the batches it was given and the sizes GroupCommit
// reported (OnBatch), and can be held open or made to fail.
type batchRecorder struct {
	mu      sync.Mutex
	batches [][]string
	sizes   []int
	hold    chan struct{} // when not nil, the first batch waits for it to close
	fail    func(ids []string) error
	panics  bool
}

func (r *batchRecorder) onBatch(size int, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sizes = append(r.sizes, size)
}

// batchSizes are the sizes of the transactions run so far, as OnBatch reported them.
func (r *batchRecorder) batchSizes() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sizes)
}

func (r *batchRecorder) apply(ctx context.Context, tx *sqlx.Tx, ids []string) ([]string, error) {
	r.mu.Lock()
	r.batches = append(r.batches, slices.Clone(ids))
	first, hold := len(r.batches) == 1, r.hold
	r.mu.Unlock()
	if first && hold != nil {
		<-hold
	}
	if r.panics {
		panic("handler bug")
	}
	for _, id := range ids {
		if err := applyEffect(ctx, tx, id); err != nil {
			return nil, err
		}
	}
	if r.fail != nil {
		if err := r.fail(ids); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

func (r *batchRecorder) seen() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.batches)
}

func newGroupCommit(t *testing.T, db *sqlx.DB, workers int, r *batchRecorder) *middleware.GroupCommit[string, string] {
	t.Helper()
	gc, err := middleware.NewGroupCommit(middleware.GroupCommitConfig{DB: db, Workers: workers, OnBatch: r.onBatch}, r.apply, nil)
	require.NoError(t, err)
	return gc
}

// doAll runs msgs through gc at once, each with serial(msg), and returns
// their errors in order once all have returned.
func doAll(gc *middleware.GroupCommit[string, string], msgs []*message.Message, serial func(*message.Message) string) []error {
	errs := make([]error, len(msgs))
	var wg sync.WaitGroup
	for i, msg := range msgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res string
			res, _, errs[i] = gc.Do(msg, serial(msg), msg.UUID)
			if errs[i] == nil && res != msg.UUID {
				errs[i] = errors.New("result of another item: " + res)
			}
		}()
	}
	wg.Wait()
	return errs
}

func newMessages(t *testing.T, n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = newMessage(t)
	}
	return msgs
}

func byUUID(msg *message.Message) string { return msg.UUID }

func TestGroupCommit_MessagesWaitingTogetherShareOneTransaction(t *testing.T) {
	t.Parallel()
	db := catalogDB(t)
	r := &batchRecorder{hold: make(chan struct{})}
	gc := newGroupCommit(t, db, 1, r)
	release := holdFirst(t, gc, r)
	// While the first transaction is held open, ten more messages queue.
	msgs := newMessages(t, 10)
	errs := make(chan []error)
	go func() { errs <- doAll(gc, msgs, byUUID) }()
	require.Eventually(t, func() bool { return gc.Waiting() == len(msgs) }, 5*time.Second, 5*time.Millisecond)
	release()

	for _, err := range <-errs {
		require.NoError(t, err)
	}
	batches := r.seen()
	require.Len(t, batches, 2, "the ten queued messages share one transaction: %v", batches)
	require.Len(t, batches[1], len(msgs))
	for _, msg := range msgs {
		require.Equal(t, 1, effectCount(t, db, msg.UUID))
	}
	require.Len(t, processedKeys(t, db), 11)
}

// holdFirst starts a transaction of one message and holds it open (r.hold)
// until the returned release is called, so that messages queue behind it and
// share the next transaction. release waits for the first message's commit.
func holdFirst(t *testing.T, gc *middleware.GroupCommit[string, string], r *batchRecorder) (release func()) {
	t.Helper()
	first := newMessage(t)
	done := make(chan error, 1)
	go func() { _, _, err := gc.Do(first, first.UUID, first.UUID); done <- err }()
	require.Eventually(t, func() bool { return len(r.seen()) == 1 }, 5*time.Second, 5*time.Millisecond)
	return func() {
		close(r.hold)
		require.NoError(t, <-done)
	}
}

func ids(msgs []*message.Message) []string {
	out := make([]string, len(msgs))
	for i, msg := range msgs {
		out[i] = msg.UUID
	}
	return out
}

// TestGroupCommit_OneFailingMessageDoesNotFailTheOthers: eight messages share
// one transaction, and one of them fails it. The test makes them share it
// (they queue behind a held transaction) and checks that they did: both
// outcomes, the failure and the commits, come out of that one shared batch.
func TestGroupCommit_OneFailingMessageDoesNotFailTheOthers(t *testing.T) {
	t.Parallel()
	db := catalogDB(t)
	msgs := newMessages(t, 8)
	bad := msgs[3].UUID
	r := &batchRecorder{hold: make(chan struct{}), fail: func(ids []string) error {
		if slices.Contains(ids, bad) {
			return errors.New("poison payload")
		}
		return nil
	}}
	gc := newGroupCommit(t, db, 1, r)
	release := holdFirst(t, gc, r)
	errsc := make(chan []error, 1)
	go func() { errsc <- doAll(gc, msgs, byUUID) }()
	require.Eventually(t, func() bool { return gc.Waiting() == len(msgs) }, 5*time.Second, 5*time.Millisecond)
	release()
	errs := <-errsc

	require.Equal(t, []int{1, len(msgs)}, r.batchSizes(), "the eight messages shared one transaction")
	batches := r.seen()
	require.ElementsMatch(t, ids(msgs), batches[1], "the failing message's first transaction held all eight")
	require.Len(t, batches, 2+len(msgs), "after the shared transaction failed, each message ran alone")
	failed, committed := 0, 0
	for i, msg := range msgs {
		if msg.UUID == bad {
			require.ErrorContains(t, errs[i], "poison payload")
			require.Zero(t, effectCount(t, db, msg.UUID))
			failed++
			continue
		}
		require.NoError(t, errs[i])
		require.Equal(t, 1, effectCount(t, db, msg.UUID), "message %d", i)
		committed++
	}
	require.Equal(t, 1, failed, "the failing message failed")
	require.Equal(t, len(msgs)-1, committed, "the others of its batch committed")
	require.Len(t, processedKeys(t, db), len(msgs), "the failed message leaves no dedup mark (the held one has its own)")
}

// TestGroupCommit_EqualSerialsNeverShareATransaction: twelve messages of three
// serials queue, in a known order, behind a held transaction, so that messages
// of equal serial wait together when the next transaction is taken. Each
// transaction must take the oldest message of each serial, and only one.
func TestGroupCommit_EqualSerialsNeverShareATransaction(t *testing.T) {
	t.Parallel()
	db := catalogDB(t)
	r := &batchRecorder{hold: make(chan struct{})}
	gc := newGroupCommit(t, db, 1, r)
	msgs := newMessages(t, 12)
	serial := map[string]string{}
	for i, msg := range msgs {
		serial[msg.UUID] = []string{"purchase-a", "purchase-b", "purchase-c"}[i%3]
	}
	release := holdFirst(t, gc, r)
	errs := make(chan error, len(msgs))
	for i, msg := range msgs {
		go func() { _, _, err := gc.Do(msg, serial[msg.UUID], msg.UUID); errs <- err }()
		require.Eventually(t, func() bool { return gc.Waiting() == i+1 }, 5*time.Second, time.Millisecond,
			"message %d queues after the ones before it", i)
	}
	release()
	for range msgs {
		require.NoError(t, <-errs)
	}

	require.Equal(t, []int{1, 3, 3, 3, 3}, r.batchSizes(),
		"each transaction held one message of each serial, no more (four waited per serial)")
	batches := r.seen()
	for i, batch := range batches[1:] {
		require.Equal(t, ids(msgs[3*i:3*i+3]), batch, "transaction %d takes the oldest message of each serial, in order", i+1)
	}
	require.Len(t, processedKeys(t, db), len(msgs)+1)
}

func TestGroupCommit_PanicRollsBackAndIsAnError(t *testing.T) {
	t.Parallel()
	db := catalogDB(t)
	gc := newGroupCommit(t, db, 1, &batchRecorder{panics: true})
	msg := newMessage(t)

	_, _, err := gc.Do(msg, msg.UUID, msg.UUID)

	require.ErrorContains(t, err, "unit of work panicked: handler bug")
	require.Zero(t, effectCount(t, db, msg.UUID))
	require.Empty(t, processedKeys(t, db))
	require.Eventually(t, func() bool { return db.Stats().InUse == 0 }, 5*time.Second, 5*time.Millisecond,
		"the connection went back to the pool")
}

func TestGroupCommit_CommitFailureIsReturnedSoTheMessageIsNotAcked(t *testing.T) {
	t.Parallel()
	db := catalogDB(t)
	// A deferred constraint is checked only at COMMIT.
	_, err := db.Exec(`CREATE TABLE mwtest_deferred (id int, CONSTRAINT mwtest_deferred_uq UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	gc, err := middleware.NewGroupCommit(middleware.GroupCommitConfig{DB: db},
		func(ctx context.Context, tx *sqlx.Tx, ids []string) ([]string, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO mwtest_deferred VALUES (1), (1)`)
			return ids, err
		}, nil)
	require.NoError(t, err)
	msg := newMessage(t)

	_, _, err = gc.Do(msg, msg.UUID, msg.UUID)

	require.ErrorContains(t, err, "commit unit of work")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM mwtest_deferred`))
	require.Zero(t, n)
	require.Empty(t, processedKeys(t, db))
}

func TestGroupCommit_MessageWhoseContextEndsBeforeItsTurnIsNotApplied(t *testing.T) {
	t.Parallel()
	db := catalogDB(t)
	r := &batchRecorder{hold: make(chan struct{})}
	gc := newGroupCommit(t, db, 1, r)
	first, late := newMessage(t), newMessage(t)
	done := make(chan error)
	go func() { _, _, err := gc.Do(first, first.UUID, first.UUID); done <- err }()
	require.Eventually(t, func() bool { return len(r.seen()) == 1 }, 5*time.Second, 5*time.Millisecond)

	ctx, cancel := context.WithCancel(context.Background())
	late.SetContext(ctx)
	lateDone := make(chan error)
	go func() { _, _, err := gc.Do(late, late.UUID, late.UUID); lateDone <- err }()
	cancel()
	require.ErrorIs(t, <-lateDone, context.Canceled)
	close(r.hold)
	require.NoError(t, <-done)

	require.Len(t, r.seen(), 1, "no transaction took the message that stopped waiting")
	require.Zero(t, effectCount(t, db, late.UUID))
}

func TestGroupCommitConfig_ReportsEveryBadSetting(t *testing.T) {
	t.Parallel()
	err := middleware.GroupCommitConfig{MaxBatch: -1, Dedup: middleware.DedupConfig{KeyPrefix: "x"}}.Validate()
	require.ErrorContains(t, err, "a database is required")
	require.ErrorContains(t, err, "must be positive")
	require.ErrorContains(t, err, "must end with ':'")
}
