package boost_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// BenchmarkApply measures Apply alone, one event per transaction as the
// consumer runs it, over 50 projects of 20 published objects each; every
// event activates a purchase on a project and one of its objects (a cascade
// of 20 objects). One consumer gives the latency of the apply path, four its
// throughput under contention on shared cards.
func BenchmarkApply(b *testing.B) {
	for _, consumers := range []int{1, 4} {
		b.Run(fmt.Sprintf("consumers=%d", consumers), func(b *testing.B) {
			db := pgtest.DB(b)
			ctx := context.Background()
			pairs := benchCards(b, db)
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range consumers {
				wg.Go(func() {
					for i := int(next.Add(1)); i <= b.N; i = int(next.Add(1)) {
						pr := pairs[(i*7919+len(pairs)/3)%len(pairs)]
						ev := changed(uuid.New(), event.StatusActive, 1+i%100, 1, onProject(pr.project), onObject(pr.object))
						if err := inTx(ctx, db, func(tx *sqlx.Tx) error { _, err := boost.Apply(ctx, tx, ev); return err }); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// cardPair is a project card and one of its published objects.
type cardPair struct{ project, object uuid.UUID }

// benchCards stores 50 project cards of 20 published objects each and
// returns every project-object pair.
func benchCards(b *testing.B, db *sqlx.DB) []cardPair {
	ctx := context.Background()
	var pairs []cardPair
	for range 50 {
		p := uuid.New()
		err := inTx(ctx, db, func(tx *sqlx.Tx) error {
			if err := boost.UpsertProjectCardTx(ctx, tx, projectCard(p)); err != nil {
				return err
			}
			for range 20 {
				o := uuid.New()
				if err := boost.UpsertPropertyObjectCardTx(ctx, tx, objectCard(o, p, true)); err != nil {
					return err
				}
				pairs = append(pairs, cardPair{p, o})
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	return pairs
}
