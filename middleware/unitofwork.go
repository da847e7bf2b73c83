package middleware

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
)

type txKey struct{}

// WithTx returns a copy of ctx that carries tx.
func WithTx(ctx context.Context, tx *sqlx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// Tx returns the unit of work's transaction carried by ctx, or nil outside UnitOfWork.
func Tx(ctx context.Context) *sqlx.Tx {
	tx, _ := ctx.Value(txKey{}).(*sqlx.Tx)
	return tx
}

// UnitOfWork runs each message's handler in one database transaction, found by
// Tx(msg.Context()). It commits when the handler returns nil and rolls back on an
// error or a panic; handlers never commit (seed: replica, card boosts and dedup
// mark commit together, then the offset is acked).
func UnitOfWork(db *sqlx.DB) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) (_ []*message.Message, err error) {
			parent := msg.Context()
			tx, err := db.BeginTxx(parent, nil)
			if err != nil {
				return nil, fmt.Errorf("begin unit of work: %w", err)
			}
			committed := false
			msg.SetContext(WithTx(parent, tx))
			defer func() {
				// Retry re-runs the chain with the same message: the next attempt
				// must not see this, finished, transaction.
				msg.SetContext(parent)
				if committed {
					return
				}
				if rbErr := tx.Rollback(); rbErr != nil && !errors.Is(rbErr, sql.ErrTxDone) && err != nil {
					err = errors.Join(err, fmt.Errorf("roll back unit of work: %w", rbErr))
				}
			}()

			out, err := h(msg)
			if err != nil {
				return nil, err
			}
			if err := tx.Commit(); err != nil {
				return nil, fmt.Errorf("commit unit of work: %w", err)
			}
			committed = true
			return out, nil
		}
	}
}
