package middleware

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/retention"
)

// DedupKeyPrefixDefault is the dedup key prefix of the Promotion Boost consumer;
// the message UUID (the event's MessageId) follows it.
const DedupKeyPrefixDefault = "catalog-promotion:purchase-changed:"

// DedupConfig configures the dedup keys of GroupCommit.
type DedupConfig struct {
	// KeyPrefix precedes the message UUID in the key stored in
	// catalog.processed_messages. Defaults to DedupKeyPrefixDefault.
	KeyPrefix string
	// Logger receives the "skipped-duplicate" record. Defaults to slog.Default().
	Logger *slog.Logger
	// OnDuplicate, if set, is called once for every message acked as a
	// duplicate, in its handler's goroutine (for a metric).
	OnDuplicate func(msg *message.Message)
}

// Validate reports a key prefix that would not read as a key of this
// consumer: it ends with ':' before the MessageId.
func (c DedupConfig) Validate() error {
	c.setDefaults() // a copy: what the component will run with
	if !strings.HasSuffix(c.KeyPrefix, ":") || strings.ContainsAny(c.KeyPrefix, " %") {
		return fmt.Errorf("dedup key prefix %q must end with ':' and hold no spaces or %%", c.KeyPrefix)
	}
	return nil
}

// skipped logs and counts a message acked as a duplicate of key.
func (c DedupConfig) skipped(msg *message.Message, key string) {
	c.Logger.InfoContext(msg.Context(), "skipped-duplicate", "MessageId", msg.UUID,
		"PurchaseId", msg.Metadata.Get(event.HeaderAggregateID), "key", key)
	if c.OnDuplicate != nil {
		c.OnDuplicate(msg)
	}
}

func (c *DedupConfig) setDefaults() {
	c.KeyPrefix = cmp.Or(c.KeyPrefix, DedupKeyPrefixDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

// CleanupDedupKeys deletes dedup keys older than keep, batch by batch through
// the processed_at index, so that catalog.processed_messages does not grow
// without bound. A redelivery older than the retention is still harmless: the
// per-purchase version guard skips or re-applies the same snapshot.
func CleanupDedupKeys(ctx context.Context, db *sqlx.DB, keep time.Duration) (int64, error) {
	return retention.Delete(ctx, db, "catalog.processed_messages", "processed_at", keep)
}
