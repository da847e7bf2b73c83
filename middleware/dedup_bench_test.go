package middleware

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// BenchmarkDedupMarks measures what a consumer transaction of batch new
// records spends on dedup, in the same run and each on a database of its
// own: the previous format (one text key per record, one statement) against
// the digest marks with the previous-format keys beside them (storeMarks),
// and against the marks alone, as they will be once the previous format is
// no longer written. The sides alternate, one transaction each, so that a
// busy machine slows them alike; marks/previous is the cost of the change.
func BenchmarkDedupMarks(b *testing.B) {
	cfg := DedupConfig{}
	cfg.setDefaults()
	for _, batch := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			ctx := context.Background()
			prevDB, marksDB, onlyDB := pgtest.DB(b), pgtest.DB(b), pgtest.DB(b)
			var prev, marks, only time.Duration
			for range b.N {
				msgs := make([]*message.Message, batch)
				for i := range msgs {
					msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"PurchaseId":%q,"Version":1}`, watermill.NewUUID())))
				}
				prev += timedTx(b, prevDB, func(tx *sqlx.Tx) error {
					keys := make([]string, len(msgs))
					for i, msg := range msgs {
						keys[i] = cfg.KeyPrefix + msg.UUID
					}
					slices.Sort(keys)
					_, err := tx.ExecContext(ctx, `INSERT INTO catalog.processed_messages (key)
						SELECT k FROM unnest($1::text[]) AS k ORDER BY k ON CONFLICT (key) DO NOTHING`, pq.Array(keys))
					return err
				})
				marks += timedTx(b, marksDB, func(tx *sqlx.Tx) error {
					keys := make([]dedupKey, len(msgs))
					for i, msg := range msgs {
						keys[i] = cfg.keyOf(msg)
					}
					_, err := storeMarks(ctx, tx, keys)
					return err
				})
				only += timedTx(b, onlyDB, func(tx *sqlx.Tx) error {
					keys := make([]dedupKey, len(msgs))
					for i, msg := range msgs {
						keys[i] = cfg.keyOf(msg)
						keys[i].legacy, keys[i].hasID = "", false // no previous format, no second look
					}
					_, err := storeMarks(ctx, tx, keys)
					return err
				})
			}
			records := float64(b.N * batch)
			b.ReportMetric(float64(only)/float64(prev), "marks-alone/previous")
			b.ReportMetric(float64(prev.Microseconds())/records, "previous-us/record")
			b.ReportMetric(float64(marks.Microseconds())/records, "marks-us/record")
			b.ReportMetric(float64(marks)/float64(prev), "marks/previous")
		})
	}
}

// timedTx runs write in a transaction of its own and returns how long the
// transaction took, commit included.
func timedTx(b *testing.B, db *sqlx.DB, write func(*sqlx.Tx) error) time.Duration {
	start := time.Now()
	tx, err := db.Beginx()
	require.NoError(b, err)
	require.NoError(b, write(tx))
	require.NoError(b, tx.Commit())
	return time.Since(start)
}
