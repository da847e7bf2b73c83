package middleware_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/logtest"
	"github.com/promoflow/promoflow/middleware"
)

type dedupBundle struct {
	db         *sqlx.DB
	logs       *logtest.Logs
	duplicates atomic.Int32
	reused     atomic.Int32
	calls      atomic.Int32
	// handle runs msg through a GroupCommit whose apply writes the effect
	// of each message and then does what next says.
	handle func(msg *message.Message, next func() error) error
}

// setupDedup is a GroupCommit over catalogDB with workers transactions in
// flight at most.
func setupDedup(t *testing.T, workers int) *dedupBundle {
	t.Helper()
	t.Parallel()
	b := &dedupBundle{db: catalogDB(t), logs: &logtest.Logs{}}
	type item struct {
		msg  *message.Message
		next func() error
	}
	gc, err := middleware.NewGroupCommit(middleware.GroupCommitConfig{
		DB: b.db, Workers: workers,
		Dedup: middleware.DedupConfig{
			Logger:      b.logs.Logger(),
			OnDuplicate: func(*message.Message) { b.duplicates.Add(1) },
			OnReused:    func(*message.Message) { b.reused.Add(1) },
		},
	}, func(ctx context.Context, tx *sqlx.Tx, items []item) ([]struct{}, error) {
		for _, it := range items {
			b.calls.Add(1)
			if err := applyEffect(ctx, tx, it.msg.UUID); err != nil {
				return nil, err
			}
			if err := it.next(); err != nil {
				return nil, err
			}
		}
		return make([]struct{}, len(items)), nil
	}, nil)
	require.NoError(t, err)
	b.handle = func(msg *message.Message, next func() error) error {
		_, _, err := gc.Do(msg, msg.UUID, item{msg: msg, next: next})
		return err
	}
	return b
}

func ok() error { return nil }

func TestDedup_DuplicateMessageIsAckedWithoutEffect(t *testing.T) {
	b := setupDedup(t, 1)
	msg := newMessage(t)

	require.NoError(t, b.handle(msg, ok))
	require.NoError(t, b.handle(msg.Copy(), ok), "a duplicate is an ack no-op")

	require.EqualValues(t, 1, b.calls.Load(), "the handler does not see the duplicate")
	require.Equal(t, 1, effectCount(t, b.db, msg.UUID))
	require.EqualValues(t, 1, b.duplicates.Load())
	require.Equal(t, []string{"catalog-promotion:purchase-changed:" + msg.UUID}, processedKeys(t, b.db))
	skipped := b.logs.Find(slog.LevelInfo, "skipped-duplicate")
	require.Len(t, skipped, 1)
	require.Equal(t, msg.UUID, skipped[0]["MessageId"])
	require.Equal(t, msg.Metadata.Get(event.HeaderAggregateID), skipped[0]["PurchaseId"])
}

func TestDedup_ConcurrentDuplicatesApplyTheEffectOnce(t *testing.T) {
	const deliveries = 5
	b := setupDedup(t, deliveries) // one transaction per delivery: one key never shares one
	msg := newMessage(t)

	// The first delivery to store the key holds its transaction open until the
	// others are seen waiting on the key's primary-key lock.
	release := make(chan struct{})
	errs := make(chan error, deliveries)
	var wg sync.WaitGroup
	for range deliveries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- b.handle(msg.Copy(), func() error { <-release; return nil })
		}()
	}
	require.Eventually(t, func() bool {
		var waiting int
		err := b.db.Get(&waiting, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`)
		return assert.NoError(t, err) && waiting == deliveries-1 && b.calls.Load() == 1
	}, 10*time.Second, 10*time.Millisecond)
	close(release)
	wg.Wait()
	close(errs)

	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 1, b.calls.Load())
	require.Equal(t, 1, effectCount(t, b.db, msg.UUID))
	require.EqualValues(t, deliveries-1, b.duplicates.Load())
	require.Len(t, b.logs.Find(slog.LevelInfo, "skipped-duplicate"), deliveries-1)
}

func TestDedup_KeyIsStoredInTheSameTransactionAsTheEffect(t *testing.T) {
	b := setupDedup(t, 1)
	msg := newMessage(t)

	err := b.handle(msg, func() error { return errors.New("card update failed") })
	require.Error(t, err)
	require.Empty(t, processedKeys(t, b.db), "a rolled-back delivery leaves no dedup mark")

	require.NoError(t, b.handle(msg.Copy(), ok), "the redelivery is applied, not skipped")
	require.EqualValues(t, 2, b.calls.Load())
	require.Equal(t, 1, effectCount(t, b.db, msg.UUID))
	require.Zero(t, b.duplicates.Load())
}

// TestDedup_MessageWithoutUUIDIsDedupedByItsPayload: a record without a
// MessageId is a valid event; its payload alone tells its redelivery from
// another record.
func TestDedup_MessageWithoutUUIDIsDedupedByItsPayload(t *testing.T) {
	b := setupDedup(t, 1)
	msg := newMessage(t)
	msg.UUID = ""
	other := message.NewMessage("", []byte(`{"other":"payload"}`))

	require.NoError(t, b.handle(msg, ok))
	require.NoError(t, b.handle(msg.Copy(), ok))
	require.NoError(t, b.handle(other, ok))

	require.EqualValues(t, 2, b.calls.Load(), "each payload applies once")
	require.EqualValues(t, 1, b.duplicates.Load())
	require.Zero(t, b.reused.Load(), "no MessageId, nothing reused")
	require.Empty(t, processedKeys(t, b.db), "no key in the previous format")
}

// TestDedup_ReusedMessageIdWithOtherPayloadIsAppliedAndCounted: a MessageId
// that comes back with other bytes is applied (what it changes is the
// handler's version guard's to decide) and reported as reused, once; each of
// its payloads, delivered again, is a duplicate. So is a MessageId longer
// than a previous-format key.
func TestDedup_ReusedMessageIdWithOtherPayloadIsAppliedAndCounted(t *testing.T) {
	b := setupDedup(t, 1)
	for _, id := range []string{watermill.NewUUID(), strings.Repeat("x", 4000) + watermill.NewUUID()} {
		first := message.NewMessage(id, []byte(`{"Version":1}`))
		second := message.NewMessage(id, []byte(`{"Version":2}`))
		calls, reused, dups := b.calls.Load(), b.reused.Load(), b.duplicates.Load()

		require.NoError(t, b.handle(first, ok))
		require.NoError(t, b.handle(second, ok))
		require.NoError(t, b.handle(first.Copy(), ok))
		require.NoError(t, b.handle(second.Copy(), ok))

		require.Equal(t, calls+2, b.calls.Load(), "each payload applies once")
		require.Equal(t, reused+1, b.reused.Load(), "the second payload is counted as reused")
		require.Equal(t, dups+2, b.duplicates.Load())
	}
	warned := b.logs.Find(slog.LevelWarn, "message-id-reused")
	require.Len(t, warned, 2)
	require.LessOrEqual(t, len(warned[1]["MessageId"]), 200, "a long MessageId is cut in logs")
}

// TestDedup_PreviousFormatKeysDedupBothWays: a record applied under the
// previous format's key (by the previous release, or before the upgrade) is
// a duplicate, and a record applied here leaves that key, so that the
// previous release, running beside, finds it.
func TestDedup_PreviousFormatKeysDedupBothWays(t *testing.T) {
	b := setupDedup(t, 1)
	before := newMessage(t)
	_, err := b.db.Exec(`INSERT INTO catalog.processed_messages (key) VALUES ($1)`, middleware.DedupKeyPrefixDefault+before.UUID)
	require.NoError(t, err)

	require.NoError(t, b.handle(before, ok))
	require.Zero(t, b.calls.Load(), "applied under the previous key: a duplicate")
	require.EqualValues(t, 1, b.duplicates.Load())

	after := newMessage(t)
	require.NoError(t, b.handle(after, ok))
	require.EqualValues(t, 1, b.calls.Load())
	require.Contains(t, processedKeys(t, b.db), middleware.DedupKeyPrefixDefault+after.UUID)
}

func TestCleanupDedupKeys_DeletesOnlyKeysPastRetention(t *testing.T) {
	t.Parallel()
	db := catalogDB(t)
	_, err := db.Exec(`INSERT INTO catalog.processed_messages (key, processed_at) VALUES
		('catalog-promotion:purchase-changed:old', now() - interval '8 days'),
		('catalog-promotion:purchase-changed:new', now() - interval '1 hour')`)
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO catalog.processed_records (message_id_digest, payload_digest, processed_at) VALUES
		('\x01', '\x01', now() - interval '8 days'), ('\x02', '\x02', now() - interval '1 hour')`)
	require.NoError(t, err)
	n, err := middleware.CleanupDedupKeys(context.Background(), db, 7*24*time.Hour)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "a mark and a previous-format key")
	require.Equal(t, []string{"catalog-promotion:purchase-changed:new"}, processedKeys(t, db))
	var marks []string
	require.NoError(t, db.Select(&marks, `SELECT encode(message_id_digest, 'hex') FROM catalog.processed_records`))
	require.Equal(t, []string{"02"}, marks)
}

func TestDedup_ConfigRefusesAPrefixThatIsNotAKeyPrefix(t *testing.T) {
	t.Parallel()
	err := middleware.GroupCommitConfig{DB: &sqlx.DB{}, Dedup: middleware.DedupConfig{KeyPrefix: "catalog-promotion"}}.Validate()
	require.ErrorContains(t, err, "must end with ':'")
}
