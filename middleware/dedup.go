package middleware

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
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

// duplicateReportKey is the context key of WithDuplicateReport.
type duplicateReportKey struct{}

// WithDuplicateReport returns a context for a message and a function that
// tells, once the chain returned, whether GroupCommit acked that message as a
// duplicate: a caller that runs records through the chain itself (the
// projection rebuild) counts duplicates apart from the records it applied.
func WithDuplicateReport(ctx context.Context) (context.Context, func() bool) {
	seen := new(atomic.Bool)
	return context.WithValue(ctx, duplicateReportKey{}, seen), seen.Load
}

// reportDuplicate marks the report of ctx, if it has one.
func reportDuplicate(ctx context.Context) {
	if seen, ok := ctx.Value(duplicateReportKey{}).(*atomic.Bool); ok {
		seen.Store(true)
	}
}

func (c *DedupConfig) setDefaults() {
	c.KeyPrefix = cmp.Or(c.KeyPrefix, DedupKeyPrefixDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

// ResetDedupTx forgets every dedup key with prefix, in tx: a projection
// rebuild does so with its reset, so that the replay that follows is applied
// rather than skipped as duplicates.
func ResetDedupTx(ctx context.Context, tx *sqlx.Tx, prefix string) error {
	if prefix == "" {
		return errors.New("reset dedup keys: prefix is required")
	}
	_, err := tx.ExecContext(ctx, `DELETE FROM catalog.processed_messages WHERE starts_with(key, $1)`, prefix)
	if err != nil {
		return fmt.Errorf("reset dedup keys: %w", err)
	}
	return nil
}

// CleanupDedupKeys deletes dedup keys older than keep, batch by batch through
// the processed_at index, so that catalog.processed_messages does not grow
// without bound. A redelivery older than the retention is still harmless: the
// per-purchase version guard skips or re-applies the same snapshot.
func CleanupDedupKeys(ctx context.Context, db *sqlx.DB, keep time.Duration) (int64, error) {
	return retention.Delete(ctx, db, "catalog.processed_messages", "processed_at", keep)
}
