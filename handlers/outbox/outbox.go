// Package outbox writes events into the promotion context's SQL outbox, in the
// caller's transaction, in the watermill-sql layout that the forwarder relays.
package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"slices"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/dberr"
)

// ForwarderTopic is the watermill-sql topic that holds enveloped events.
const ForwarderTopic = "promotion_outbox"

// Tables created by sqlmigrate (0002_promotion_outbox.sql).
const (
	MessagesTable = "promotion.outbox_messages"
	OffsetsTable  = "promotion.outbox_offsets"
)

// RelayConsumerGroup is the forwarder's consumer group in OffsetsTable.
const RelayConsumerGroup = "promotion-outbox-relay"

// Schema is the watermill-sql schema adapter for the outbox tables.
func Schema(subscribeBatchSize int) wmsql.DefaultPostgreSQLSchema {
	return wmsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: func(string) string { return MessagesTable },
		SubscribeBatchSize:        subscribeBatchSize,
	}
}

// Offsets is the watermill-sql offsets adapter for the outbox tables.
func Offsets() wmsql.DefaultPostgreSQLOffsetsAdapter {
	return wmsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(string) string { return OffsetsTable },
	}
}

// Tx is a transaction that may write the outbox: one that BeginTx began.
type Tx struct{ *sqlx.Tx }

// BeginTx begins a transaction that may write the outbox. Its first statement
// takes the outbox writer lock (promotion.outbox_writer_lock, shared), before
// the transaction has an id: the relay's horizon waits only for the holders of
// that lock (RelaySchema), so a transaction that wrote the outbox without it
// could be passed over while it runs and its rows never relayed. The database
// refuses an outbox row from any other transaction.
//
// The same statement then checks the write freeze
// (promotion.outbox_writable: `promoflow outbox drain`, or
// default_transaction_read_only): a frozen or read-only database, and a
// standby, give an error that wraps dberr.ErrReadOnly.
func BeginTx(ctx context.Context, db *sqlx.DB, opts *sql.TxOptions) (*Tx, error) {
	tx, err := db.BeginTxx(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", dberr.Classify(ctx, err, dberr.InRecovery(db.DB)))
	}
	if _, err := tx.ExecContext(ctx, `SELECT promotion.outbox_writer_lock(), promotion.outbox_writable()`); err != nil {
		_ = tx.Rollback()
		return nil, fmt.Errorf("take the outbox writer lock: %w", dberr.Classify(ctx, err, dberr.InRecovery(db.DB)))
	}
	return &Tx{tx}, nil
}

// PublishTx enqueues msgs for destTopic in tx, in order, as one outbox row
// (MaxEventsPerRow at most per row). They reach Kafka only if tx commits.
func PublishTx(tx *Tx, destTopic string, msgs ...*message.Message) error {
	pub, err := wmsql.NewPublisher(tx.Tx, wmsql.PublisherConfig{SchemaAdapter: Schema(0)}, nil)
	if err != nil {
		return fmt.Errorf("outbox publisher: %w", err)
	}
	for chunk := range slices.Chunk(msgs, MaxEventsPerRow) {
		batch := pack(chunk)
		// The row's metadata column counts its events (the shared trace
		// headers are in the envelope's metadata only).
		row := message.Metadata{EventsMetadataKey: batch.Metadata.Get(EventsMetadataKey)}
		fwd := forwarder.NewPublisher(rowMetadata{pub, row}, forwarder.PublisherConfig{ForwarderTopic: ForwarderTopic})
		if err := fwd.Publish(destTopic, batch); err != nil {
			return fmt.Errorf("write outbox: %w", err)
		}
	}
	return nil
}
