package boost_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// BenchmarkApplyBatchStatements measures what turning prepared statements off
// costs (router.CatalogConfig.DisablePreparedStatements): ApplyBatch in one
// transaction per batch, with the statements prepared once per connection
// (boost.Prepare, the default), with them sent as text, and as text through a
// PgBouncer in transaction pooling, where prepared ones cannot go. The three
// forms take turns in rounds of 100 events on one database, so they share the
// machine's ups and downs; each reports events/s, and the ratios are text over
// prepared. Events activate purchases on a project and one of its objects, as
// BenchmarkApply's; batch=16 is about the consumer's batch at 48 partitions
// (docs/benchmarks.md), batch=1 its smallest.
func BenchmarkApplyBatchStatements(b *testing.B) {
	events := 5_000
	if testing.Short() {
		events = 1_000
	}
	for _, batch := range []int{1, 16} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			ctx := context.Background()
			url := pgtest.DatabaseURL(b)
			db := pgtest.Open(b, url)
			pooled := pgtest.Open(b, pgtest.StartPgBouncer(b, pgtest.PgBouncerOptions{Upstream: url}).URL())
			pairs := benchCards(b, db)
			prepared, err := boost.Prepare(ctx, db)
			if err != nil {
				b.Fatal(err)
			}
			defer prepared.Close()
			forms := []struct {
				name  string
				db    *sqlx.DB
				apply func(context.Context, *sqlx.Tx, []event.PurchaseChanged) ([]boost.Outcome, error)
				took  time.Duration
			}{
				{name: "prepared", db: db, apply: prepared.ApplyBatch},
				{name: "text", db: db, apply: boost.ApplyBatch},
				{name: "text-pgbouncer", db: pooled, apply: boost.ApplyBatch},
			}
			next := 0
			b.ResetTimer()
			for range b.N {
				for done := 0; done < events; done += 100 {
					for f := range forms {
						start := time.Now()
						for i := 0; i < 100; i += batch {
							evs := make([]event.PurchaseChanged, batch)
							for j := range evs {
								pr := pairs[(next*7919)%len(pairs)]
								next++
								evs[j] = changed(uuid.New(), event.StatusActive, 1+next%100, 1, onProject(pr.project), onObject(pr.object))
							}
							if err := inTx(ctx, forms[f].db, func(tx *sqlx.Tx) error { _, err := forms[f].apply(ctx, tx, evs); return err }); err != nil {
								b.Fatalf("%s: %v", forms[f].name, err)
							}
						}
						forms[f].took += time.Since(start)
					}
				}
			}
			rate := func(f int) float64 { return float64(events*b.N) / forms[f].took.Seconds() }
			for f := range forms {
				b.ReportMetric(rate(f), forms[f].name+"-events/s")
			}
			b.ReportMetric(rate(1)/rate(0), "text/prepared")
			b.ReportMetric(rate(2)/rate(0), "text-pgbouncer/prepared")
		})
	}
}
