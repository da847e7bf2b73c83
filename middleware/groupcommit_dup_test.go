package middleware_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestGroupCommit_DuplicateWhoseHandlerReturnedIsNotRaced: a transaction
// takes a message whose dedup key another delivery holds uncommitted; the
// message's context ends and its handler returns, and the chain above it
// (Retry, tracing) sets the message's context again, while the transaction
// still runs. When the first delivery commits, the transaction finds the
// message a duplicate: it must not touch the message any more (run with
// -race). The message was not acked as a duplicate, so nothing reports it
// as one; its redelivery is the duplicate that is reported.
func TestGroupCommit_DuplicateWhoseHandlerReturnedIsNotRaced(t *testing.T) {
	t.Parallel()
	db := catalogDB(t)
	var duplicates atomic.Int32
	batches := make(chan int, 8)
	gc, err := middleware.NewGroupCommit(middleware.GroupCommitConfig{DB: db,
		Dedup:   middleware.DedupConfig{OnDuplicate: func(*message.Message) { duplicates.Add(1) }},
		OnBatch: func(size int, _ time.Duration) { batches <- size },
	}, (&batchRecorder{}).apply, nil)
	require.NoError(t, err)

	msg := newMessage(t)
	first := db.MustBegin() // the first delivery, its key not yet committed
	defer first.Rollback()  //nolint:errcheck // committed below; a no-op then
	first.MustExec(`INSERT INTO catalog.processed_messages (key) VALUES ($1)`, middleware.DedupKeyPrefixDefault+msg.UUID)
	firstPid := pgtest.BackendPid(t, first)

	ctx, cancel := context.WithCancel(context.Background())
	msg.SetContext(ctx)
	done := make(chan error, 1)
	go func() { _, _, err := gc.Do(msg, msg.UUID, msg.UUID); done <- err }()
	pgtest.WaitBlockedBy(t, db, firstPid) // a transaction took the message and waits on its key
	cancel()
	require.ErrorIs(t, <-done, context.Canceled, "the handler returns when its context ends")

	require.NoError(t, first.Commit())
	// As Retry restores the parent context on its way out. After the commit:
	// the race detector orders every socket write before every later socket
	// read, so a write of the context before it would look ordered.
	msg.SetContext(context.Background())
	require.Equal(t, 1, <-batches, "the transaction that took the message ended")
	require.Zero(t, duplicates.Load(), "a message whose handler returned an error was not acked as a duplicate")

	_, dup, err := gc.Do(msg, msg.UUID, msg.UUID) // its redelivery
	require.NoError(t, err)
	require.True(t, dup)
	require.EqualValues(t, 1, duplicates.Load())
	require.Zero(t, effectCount(t, db, msg.UUID), "a duplicate applies nothing")
}
