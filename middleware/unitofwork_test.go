package middleware_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/middleware"
)

func setupUnitOfWork(t *testing.T) (*sqlx.DB, message.HandlerMiddleware) {
	t.Helper()
	t.Parallel()
	db := catalogDB(t)
	return db, middleware.UnitOfWork(db)
}

func TestUnitOfWork_CommitsWhenHandlerSucceeds(t *testing.T) {
	db, uow := setupUnitOfWork(t)
	msg := newMessage(t)

	var sawTx bool
	_, err := uow(func(msg *message.Message) ([]*message.Message, error) {
		sawTx = middleware.Tx(msg.Context()) != nil
		return nil, applyEffect(msg)
	})(msg)

	require.NoError(t, err)
	require.True(t, sawTx, "the handler finds the transaction in the message context")
	require.Equal(t, 1, effectCount(t, db, msg.UUID))
	require.Nil(t, middleware.Tx(msg.Context()), "a finished transaction does not leak into the next attempt")
}

func TestUnitOfWork_RollsBackOnError(t *testing.T) {
	db, uow := setupUnitOfWork(t)
	msg := newMessage(t)
	boom := errors.New("boom")

	_, err := uow(func(msg *message.Message) ([]*message.Message, error) {
		require.NoError(t, applyEffect(msg))
		return nil, boom
	})(msg)

	require.ErrorIs(t, err, boom)
	require.Zero(t, effectCount(t, db, msg.UUID))
	require.Nil(t, middleware.Tx(msg.Context()))
	require.Zero(t, db.Stats().InUse, "the connection went back to the pool")
}

func TestUnitOfWork_RollsBackOnPanic(t *testing.T) {
	db, uow := setupUnitOfWork(t)
	msg := newMessage(t)

	require.PanicsWithValue(t, "handler bug", func() {
		_, _ = uow(func(msg *message.Message) ([]*message.Message, error) {
			require.NoError(t, applyEffect(msg))
			panic("handler bug")
		})(msg)
	})

	require.Zero(t, effectCount(t, db, msg.UUID))
	require.Zero(t, db.Stats().InUse, "the connection went back to the pool")
}

func TestUnitOfWork_CommitFailureIsReturnedSoTheMessageIsNotAcked(t *testing.T) {
	db, uow := setupUnitOfWork(t)
	// A deferred constraint is checked only at COMMIT.
	_, err := db.Exec(`CREATE TABLE mwtest_deferred (id int, CONSTRAINT mwtest_deferred_uq UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)

	_, err = uow(func(msg *message.Message) ([]*message.Message, error) {
		_, err := middleware.Tx(msg.Context()).Exec(`INSERT INTO mwtest_deferred VALUES (1), (1)`)
		return nil, err
	})(newMessage(t))

	require.ErrorContains(t, err, "commit unit of work")
	var n int
	require.NoError(t, db.Get(&n, `SELECT count(*) FROM mwtest_deferred`))
	require.Zero(t, n)
}
