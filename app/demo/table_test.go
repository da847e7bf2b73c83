package demo

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
)

// TestTable_ShowsEachCardsBoostItsLastChangeAndWhatComesNextForEachPurchase
// pins the live table's lines.
func TestTable_ShowsEachCardsBoostItsLastChangeAndWhatComesNextForEachPurchase(t *testing.T) {
	now := time.Date(2026, 12, 1, 21, 41, 20, 0, time.Local)
	s := State{At: now, Cards: []CardState{
		{Label: "A", Title: "Riverside", Project: true, Boost: 10, Change: 10, ChangedAt: now.Add(-time.Second)},
		{Label: "A1", Title: "Riverside flat A1", Published: true, Boost: 10, Change: 10, ChangedAt: now.Add(-time.Minute)},
		{Label: "A4", Title: "Riverside flat A4", Boost: 0},
		{Label: "B2", Title: "Hillview flat B2", Published: true, Boost: 5, Change: -3, ChangedAt: now.Add(-2 * time.Second)},
	}, Purchases: []PurchaseState{
		{Label: "P1", Target: "Project A", Kind: event.TargetProject, Weight: 10, Status: event.StatusActive, EndsAt: now.Add(12400 * time.Millisecond)},
		{Label: "P2", Target: "PropertyObject B2", Kind: event.TargetPropertyObject, Weight: 5, Status: event.StatusActive, EndsAt: now.Add(time.Hour)},
		{Label: "P3", Target: "Project B", Kind: event.TargetProject, Weight: 3, Status: event.StatusActive, EndsAt: now.Add(time.Hour), CancelAt: now.Add(4 * time.Second)},
		{Label: "P4", Target: "Post", Kind: event.TargetPost, Weight: 50, Status: event.StatusActive, EndsAt: now.Add(time.Hour)},
		{Label: "P5", Target: "Project B", Kind: event.TargetProject, Weight: 1, Status: event.StatusExpired},
		{Label: "P6", Target: "Post", Kind: event.TargetPost, Weight: 1},
	}}
	require.Equal(t, strings.Join([]string{
		"PromotionBoost of the demo cards             21:41:20",
		"  CARD                           PUBLISHED  BOOST",
		"  Project A  Riverside                         10  ▲  +10",
		"    A1  Riverside flat A1        yes           10",
		"    A4  Riverside flat A4        no             0",
		"    B2  Hillview flat B2         yes            5  ▼  -3",
		"",
		"  PURCHASE TARGET               WEIGHT  STATUS",
		"  P1       Project A                10  Active     ends in 12s",
		"  P2       PropertyObject B2         5  Active     ends in 1h",
		"  P3       Project B                 3  Active     the demo cancels it in 4s",
		"  P4       Post                     50  Active     a Post: the news context's, the catalog ignores it",
		"  P5       Project B                 1  Expired",
		"  P6       Post                      1  -",
	}, "\n"), strings.Join(Table(s, now), "\n"))
}

// TestExpiredText_SaysOnTimeUntilTwoSecondsPastEndsAt: the expiry event says
// how late the expirer was, by PostgreSQL's clock.
func TestExpiredText_SaysOnTimeUntilTwoSecondsPastEndsAt(t *testing.T) {
	ends := time.Date(2026, 12, 1, 21, 41, 32, 512_000_000, time.Local)
	require.Equal(t, "on time: EndsAt 21:41:32.512, Expired at 21:41:32.530 (+18ms); A and A1-A3 lost its 10",
		expiredText(&purchase{EndsAt: ends, UpdatedAt: ends.Add(18 * time.Millisecond)}))
	require.Equal(t, "late: EndsAt 21:41:32.512, Expired at 21:41:35.512 (+3000ms); A and A1-A3 lost its 10",
		expiredText(&purchase{EndsAt: ends, UpdatedAt: ends.Add(3 * time.Second)}))
}
