package purchase_test

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/purchase"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestSelectDue_StartsPastTheCursor: a cycle's batches walk the due
// purchases once, in (EndsAt, Id) order, each starting past the last row the
// one before it selected, also through purchases that share one EndsAt. The
// rows stay Active here, so a select that ignored the cursor would return
// the first ones again.
func TestSelectDue_StartsPastTheCursor(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	now := time.Now().Truncate(time.Microsecond)
	seeded := append(purchasetest.SeedActive(t, db, 3, now.Add(-time.Hour)), purchasetest.SeedActive(t, db, 4, now.Add(-time.Minute))...)
	purchasetest.SeedActive(t, db, 2, now.Add(time.Hour)) // not due

	var walked []uuid.UUID
	var from purchase.DueCursor
	for range len(seeded) {
		tx := db.MustBegin()
		rows, err := purchase.SelectDueTx(t.Context(), tx, now, from, 2, nil)
		require.NoError(t, err)
		require.NoError(t, tx.Rollback())
		if len(rows) == 0 {
			break
		}
		for _, r := range rows {
			walked = append(walked, r.ID)
		}
		last := rows[len(rows)-1]
		from = purchase.DueCursor{EndsAt: last.EndsAt, ID: last.ID}
	}

	want := append(sortedIDs(seeded[:3]), sortedIDs(seeded[3:])...)
	require.Equal(t, want, walked, "each due purchase once, in (EndsAt, Id) order")
}

// sortedIDs is ids in PostgreSQL's order of uuid (their bytes).
func sortedIDs(ids []uuid.UUID) []uuid.UUID {
	out := slices.Clone(ids)
	slices.SortFunc(out, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	return out
}
