package expire_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/purchase"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// benchRows is how many due purchases each side of the benchmark expires.
const benchRows = 10_000

// BenchmarkExpire measures the expirer's DB stage (select, transition, outbox
// write, one transaction per batch of 200) against a raw SQL baseline doing
// the same work without Watermill, in the same run on the same database.
// It reports rows/s of both and their ratio (target: expirer >= 0.6 x raw).
func BenchmarkExpire(b *testing.B) {
	db := pgtest.DB(b)
	exp, err := expire.New(db, expire.Config{BatchSize: 200}, slog.New(slog.DiscardHandler))
	require.NoError(b, err)

	var rawSecs, expSecs float64
	timeRaw := func() {
		reset(b, db)
		purchasetest.SeedActive(b, db, benchRows, time.Now().Add(-time.Minute))
		start := time.Now()
		n := rawExpire(b, db, 200)
		rawSecs += time.Since(start).Seconds()
		require.Equal(b, benchRows, n)
	}
	timeExpirer := func() {
		reset(b, db)
		purchasetest.SeedActive(b, db, benchRows, time.Now().Add(-time.Minute))
		start := time.Now()
		res, err := exp.RunCycle(context.Background())
		expSecs += time.Since(start).Seconds()
		require.NoError(b, err)
		require.Equal(b, benchRows, res.ExpiredCount)
	}
	// Alternate which side goes first, so neither always meets a warmer cache.
	for i := range b.N {
		if i%2 == 0 {
			timeRaw()
			timeExpirer()
		} else {
			timeExpirer()
			timeRaw()
		}
	}
	raw := float64(benchRows*b.N) / rawSecs
	got := float64(benchRows*b.N) / expSecs
	b.ReportMetric(raw, "raw-rows/s")
	b.ReportMetric(got, "expirer-rows/s")
	b.ReportMetric(got/raw, "ratio")
}

func reset(b *testing.B, db *sqlx.DB) {
	_, err := db.Exec(`TRUNCATE promotion.promotion_purchases, promotion.idempotency_keys, promotion.outbox_messages`)
	require.NoError(b, err)
	_, err = db.Exec(`VACUUM ANALYZE promotion.promotion_purchases`)
	require.NoError(b, err)
}

// rawExpire is the baseline: UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP
// LOCKED) RETURNING, then one multi-row INSERT of the same event envelopes into
// the outbox, one transaction per batch.
func rawExpire(b *testing.B, db *sqlx.DB, batch int) int {
	total := 0
	for {
		asOf := time.Now().UTC()
		tx, err := db.Beginx()
		require.NoError(b, err)
		_, err = tx.Exec(`SELECT promotion.outbox_writer_lock()`)
		require.NoError(b, err)
		var rows []purchase.Row
		require.NoError(b, tx.Select(&rows, `UPDATE promotion.promotion_purchases p
			SET status = 'Expired', updated_at = $1, version = p.version + 1
			WHERE p.id IN (SELECT id FROM promotion.promotion_purchases
				WHERE status = 'Active' AND ends_at <= $1 ORDER BY ends_at LIMIT $2 FOR UPDATE SKIP LOCKED)
			RETURNING `+purchase.Columns, asOf, batch))
		if len(rows) == 0 {
			require.NoError(b, tx.Commit())
			return total
		}
		uuids := make([]string, len(rows))
		payloads := make([]string, len(rows))
		for i, r := range rows {
			p, err := r.Decode()
			require.NoError(b, err)
			msg, err := event.NewMessage(p.Event(), "bench", asOf)
			require.NoError(b, err)
			env, err := json.Marshal(map[string]any{"destination_topic": event.Topic, "uuid": msg.UUID,
				"payload": msg.Payload, "metadata": msg.Metadata})
			require.NoError(b, err)
			uuids[i], payloads[i] = uuid.NewString(), string(env)
		}
		_, err = tx.Exec(`INSERT INTO promotion.outbox_messages (uuid, payload, metadata, transaction_id)
			SELECT u, p::json, '{}'::json, pg_current_xact_id() FROM unnest($1::text[], $2::text[]) AS x(u, p)`,
			pq.Array(uuids), pq.Array(payloads))
		require.NoError(b, err)
		require.NoError(b, tx.Commit())
		total += len(rows)
	}
}
