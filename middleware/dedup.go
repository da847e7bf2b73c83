package middleware

import (
	"cmp"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/retention"
)

// DedupKeyPrefixDefault is the dedup key prefix of the Promotion Boost consumer;
// the message UUID (the event's MessageId) follows it.
const DedupKeyPrefixDefault = "catalog-promotion:purchase-changed:"

// LegacyKeyMaxMessageID is the longest MessageId, in bytes, whose dedup key is
// also written in the previous format (catalog.processed_messages), so that
// the previous release, running beside this one, finds it. A UUID is 36.
const LegacyKeyMaxMessageID = 256

// DedupConfig configures the dedup keys of GroupCommit.
type DedupConfig struct {
	// KeyPrefix precedes the message UUID in the dedup key, whose digest
	// is stored in catalog.processed_records. Defaults to DedupKeyPrefixDefault.
	KeyPrefix string
	// Logger receives the "skipped-duplicate" and "message-id-reused"
	// records. Defaults to slog.Default().
	Logger *slog.Logger
	// OnDuplicate, if set, is called once for every message acked as a
	// duplicate, in its handler's goroutine (for a metric).
	OnDuplicate func(msg *message.Message)
	// OnReused, if set, is called once for every message applied whose
	// MessageId came before with another payload, in its handler's
	// goroutine (for a metric).
	OnReused func(msg *message.Message)
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

// logIDMax is as much of a MessageId as a log record carries: a MessageId
// can be as long as a record header.
const logIDMax = 128

// logged logs msg's event under message, with its MessageId (cut to
// logIDMax bytes) and PurchaseId.
func (c DedupConfig) logged(level slog.Level, msg *message.Message, message string, key dedupKey) {
	id := msg.UUID
	if len(id) > logIDMax {
		id = strings.ToValidUTF8(id[:logIDMax], "") + "…"
	}
	c.Logger.Log(msg.Context(), level, message, "MessageId", id,
		"PurchaseId", msg.Metadata.Get(event.HeaderAggregateID), "key", key.String())
}

// skipped logs and counts a message acked as a duplicate of key.
func (c DedupConfig) skipped(msg *message.Message, key dedupKey) {
	c.logged(slog.LevelInfo, msg, "skipped-duplicate", key)
	if c.OnDuplicate != nil {
		c.OnDuplicate(msg)
	}
}

// reused logs and counts a message applied although its MessageId came
// before with another payload: a producer that reuses ids.
func (c DedupConfig) reused(msg *message.Message, key dedupKey) {
	c.logged(slog.LevelWarn, msg, "message-id-reused", key)
	if c.OnReused != nil {
		c.OnReused(msg)
	}
}

func (c *DedupConfig) setDefaults() {
	c.KeyPrefix = cmp.Or(c.KeyPrefix, DedupKeyPrefixDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

// dedupKey is a message's dedup mark: the digests of its dedup key
// (KeyPrefix and MessageId) and of its payload, 64 bytes whatever their
// size, and the key in the previous format where it applies (migration 0017).
type dedupKey struct {
	id, payload []byte
	// legacy is the previous format's key, written beside the mark; probe
	// is that key of a longer MessageId, looked up only. Either is "" when
	// the previous release could not have stored it.
	legacy, probe string
	// hasID is false for a message without a MessageId: nothing to reuse.
	hasID bool
}

// keyOf is msg's dedup mark.
func (c DedupConfig) keyOf(msg *message.Message) dedupKey {
	key := c.KeyPrefix + msg.UUID
	id, payload := sha256.Sum256([]byte(key)), sha256.Sum256(msg.Payload)
	k := dedupKey{id: id[:], payload: payload[:], hasID: msg.UUID != ""}
	// text holds no NUL, and the server refuses bytes that are not UTF-8.
	if k.hasID && utf8.ValidString(key) && !strings.ContainsRune(key, 0) {
		if len(msg.UUID) <= LegacyKeyMaxMessageID {
			k.legacy = key
		} else {
			k.probe = key
		}
	}
	return k
}

// String is the mark as logs name it: both digests in hex.
func (k dedupKey) String() string {
	return hex.EncodeToString(k.id) + ":" + hex.EncodeToString(k.payload)
}

// markOutcome is what storeMarks found of one mark.
type markOutcome int

const (
	markDuplicate markOutcome = iota
	markNew
	// markReused: new, but its MessageId came before with another payload.
	markReused
)

// storeMarksSQL stores the marks in digest order, so that concurrent
// transactions wait on each other's marks in one order, and then (ARRAY:
// every mark is stored before the first key) the previous-format keys of the
// new ones, in key order. It returns the MessageId digests of the new marks
// and, apart, the previous-format keys it stored: a join of the two in SQL
// compared every key with every other one, a fifth of the statement's time
// at batches of 64.
const storeMarksSQL = `WITH fresh AS (
		INSERT INTO catalog.processed_records (message_id_digest, payload_digest)
		SELECT * FROM unnest($1::bytea[], $2::bytea[]) ORDER BY 1, 2
		ON CONFLICT DO NOTHING
		RETURNING message_id_digest
	), legacy AS (
		INSERT INTO catalog.processed_messages (key)
		SELECT k FROM unnest($1::bytea[], $3::text[]) AS i(id, k)
		WHERE k <> '' AND id = ANY(ARRAY(SELECT message_id_digest FROM fresh)) ORDER BY 1
		ON CONFLICT (key) DO NOTHING
		RETURNING key
	)
	SELECT message_id_digest AS id, NULL AS key FROM fresh
	UNION ALL SELECT NULL, key FROM legacy`

// checkMarksSQL tells, for new marks that need it, whether their MessageId
// has a mark with another payload, and whether their previous-format key is
// stored. A statement of its own, after storeMarksSQL: its snapshot sees
// what a transaction it waited for there committed.
const checkMarksSQL = `SELECT EXISTS (SELECT 1 FROM catalog.processed_records r
		WHERE r.message_id_digest = i.id AND r.payload_digest <> i.payload) AS reused,
	i.legacy <> '' AND EXISTS (SELECT 1 FROM catalog.processed_messages m WHERE m.key = i.legacy) AS legacy
	FROM unnest($1::bytea[], $2::bytea[], $3::text[]) WITH ORDINALITY AS i(id, payload, legacy, n)
	ORDER BY n`

// storeMarks stores keys (distinct MessageIds) in tx and returns what it
// found of each. A mark stored already is a duplicate. A new mark whose
// MessageId has a mark with another payload is reused (this release wrote
// the previous-format key, if it was there). Otherwise a new mark whose
// previous-format key was there is a duplicate of a record applied under the
// old key.
func storeMarks(ctx context.Context, tx *sqlx.Tx, keys []dedupKey) ([]markOutcome, error) {
	ids, payloads, legacy := make([][]byte, len(keys)), make([][]byte, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		ids[i], payloads[i], legacy[i] = k.id, k.payload, k.legacy
	}
	var rows []struct {
		ID  []byte         `db:"id"`
		Key sql.NullString `db:"key"`
	}
	if err := tx.SelectContext(ctx, &rows, storeMarksSQL, pq.Array(ids), pq.Array(payloads), pq.Array(legacy)); err != nil {
		return nil, fmt.Errorf("store dedup marks: %w", err)
	}
	stored := make(map[string]bool, len(rows))
	for _, r := range rows {
		if r.Key.Valid {
			stored["k"+r.Key.String] = true
		} else {
			stored["d"+string(r.ID)] = true
		}
	}
	out := make([]markOutcome, len(keys))
	var check []int
	for i, k := range keys {
		taken := k.legacy != "" && !stored["k"+k.legacy]
		switch {
		case !stored["d"+string(k.id)]:
			out[i] = markDuplicate
		case k.hasID && (taken || k.legacy == ""):
			check = append(check, i)
		default:
			out[i] = markNew
		}
	}
	if len(check) == 0 {
		return out, nil
	}
	return out, checkMarks(ctx, tx, keys, check, out)
}

// checkMarks sets out[i] of each of check: reused, a duplicate under the
// previous format, or new.
func checkMarks(ctx context.Context, tx *sqlx.Tx, keys []dedupKey, check []int, out []markOutcome) error {
	var ids, payloads [][]byte
	var old []string
	for _, i := range check {
		ids, payloads, old = append(ids, keys[i].id), append(payloads, keys[i].payload), append(old, keys[i].legacy+keys[i].probe)
	}
	var found []struct {
		Reused bool `db:"reused"`
		Legacy bool `db:"legacy"`
	}
	if err := tx.SelectContext(ctx, &found, checkMarksSQL, pq.Array(ids), pq.Array(payloads), pq.Array(old)); err != nil {
		return fmt.Errorf("check dedup marks: %w", err)
	}
	for n, f := range found {
		switch i := check[n]; {
		case f.Reused:
			out[i] = markReused
		case f.Legacy:
			out[i] = markDuplicate
		default:
			out[i] = markNew
		}
	}
	return nil
}

// CleanupDedupKeys deletes dedup marks older than keep, of both formats,
// batch by batch through the processed_at indexes, so that the dedup tables
// do not grow without bound. A redelivery older than the retention is still
// harmless: the per-purchase version guard skips or re-applies the same
// snapshot.
func CleanupDedupKeys(ctx context.Context, db *sqlx.DB, keep time.Duration) (int64, error) {
	n, err := retention.Delete(ctx, db, "catalog.processed_records", "processed_at", keep)
	if err != nil {
		return n, err
	}
	old, err := retention.Delete(ctx, db, "catalog.processed_messages", "processed_at", keep)
	return n + old, err
}
