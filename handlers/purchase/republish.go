package purchase

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/outbox"
)

// RepublishConfig configures Republish.
type RepublishConfig struct {
	// Topic is where the events go. Required.
	Topic string
	// BatchSize is the most purchases one transaction republishes. Defaults to 500.
	BatchSize int
	// After resumes past this purchase id (the last one a run reported). Optional.
	After uuid.UUID
	// CorrelationID marks the run's events. Defaults to "republish-" and a new id.
	CorrelationID string
}

// RepublishBatchSizeDefault is RepublishConfig.BatchSize's default.
const RepublishBatchSizeDefault = 500

func (c *RepublishConfig) setDefaults() {
	c.BatchSize = cmp.Or(c.BatchSize, RepublishBatchSizeDefault)
	c.CorrelationID = cmp.Or(c.CorrelationID, "republish-"+uuid.NewString())
}

// Validate reports every missing or out-of-range setting.
func (c RepublishConfig) Validate() error {
	c.setDefaults()
	var errs []error
	if c.Topic == "" {
		errs = append(errs, errors.New("republish: the topic is required"))
	}
	if c.BatchSize < 1 || c.BatchSize > outbox.MaxEventsPerRow {
		errs = append(errs, fmt.Errorf("republish: the batch size must be 1..%d", outbox.MaxEventsPerRow))
	}
	return errors.Join(errs...)
}

// Republish writes every purchase's current state into the outbox for
// cfg.Topic, as the PurchaseChanged event of its current Version, in id
// order, a batch per transaction; progress hears after each commit how many
// are done and the last id (RepublishConfig.After resumes there). It is
// what fills a new purchase topic with every purchase, so that a rebuild of
// the catalog from it is complete (docs/runbooks/purchase-topic-changed.md).
//
// Each transaction takes the outbox writer lock and locks its purchases FOR
// SHARE: a change of one of them commits before it (and is republished in
// its new state) or after it (and its event follows the republished one),
// so the outbox, which the relay publishes in commit order, keeps each
// purchase's versions in increasing order. The consumer applies a
// republished event of the Version it holds as a no-op.
func Republish(ctx context.Context, db *sqlx.DB, cfg RepublishConfig, progress func(done int, last uuid.UUID)) (int, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	done, last := 0, cfg.After
	for {
		n, next, err := republishBatch(ctx, db, cfg, last)
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, nil
		}
		done, last = done+n, next
		if progress != nil {
			progress(done, last)
		}
	}
}

// republishBatch republishes the purchases after id, up to a batch, in one
// transaction, and returns how many and the last id.
func republishBatch(ctx context.Context, db *sqlx.DB, cfg RepublishConfig, after uuid.UUID) (int, uuid.UUID, error) {
	tx, err := outbox.BeginTx(ctx, db, nil)
	if err != nil {
		return 0, after, err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	var rows []Row
	if err := tx.SelectContext(ctx, &rows, `SELECT `+Columns+` FROM promotion.promotion_purchases
		WHERE id > $1 ORDER BY id LIMIT $2 FOR SHARE`, after, cfg.BatchSize); err != nil {
		return 0, after, fmt.Errorf("select purchases after %s: %w", after, err)
	}
	if len(rows) == 0 {
		return 0, after, nil
	}
	purchases, err := decodeAll(rows)
	if err != nil {
		return 0, after, err
	}
	msgs := make([]*message.Message, len(purchases))
	for i, p := range purchases {
		// Occurred at its last change: the state it carries is that old.
		if msgs[i], err = event.NewMessage(p.Event(), cfg.CorrelationID, p.UpdatedAt); err != nil {
			return 0, after, err
		}
	}
	if err := outbox.PublishTx(tx, cfg.Topic, msgs...); err != nil {
		return 0, after, err
	}
	if err := tx.Commit(); err != nil {
		return 0, after, fmt.Errorf("commit: %w", err)
	}
	return len(purchases), purchases[len(purchases)-1].ID, nil
}
