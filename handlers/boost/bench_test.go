package boost_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/app/testenv"
	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
)

// BenchmarkApply measures one event per transaction, as the consumer runs it,
// from parallel consumers over 50 projects of 20 published objects each; every
// event targets a project and one of its objects.
func BenchmarkApply(b *testing.B) {
	db := testenv.DB(b)
	ctx := context.Background()
	type pair struct{ project, object uuid.UUID }
	var pairs []pair
	err := inTx(ctx, db, func(tx *sqlx.Tx) error {
		for range 50 {
			p := uuid.New()
			if err := boost.UpsertProjectCardTx(ctx, tx, projectCard(p)); err != nil {
				return err
			}
			for range 20 {
				o := uuid.New()
				if err := boost.UpsertPropertyObjectCardTx(ctx, tx, objectCard(o, p, true)); err != nil {
					return err
				}
				pairs = append(pairs, pair{p, o})
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(2) // 2 × GOMAXPROCS consumers
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			pr := pairs[(i*7919+len(pairs)/3)%len(pairs)]
			ev := changed(uuid.New(), event.StatusActive, 1+i%100, 1, onProject(pr.project), onObject(pr.object))
			if err := inTx(ctx, db, func(tx *sqlx.Tx) error { _, err := boost.Apply(ctx, tx, ev); return err }); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
