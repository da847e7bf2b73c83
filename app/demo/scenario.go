package demo

import (
	"time"

	"github.com/google/uuid"

	"github.com/promoflow/promoflow/handlers/event"
)

// card is one card of the demo catalog. Every run makes new ids, so a run on
// a database that holds an earlier one starts from cards of its own.
type card struct {
	Label     string    // A, A1, ...: its name in the table and the steps
	Title     string    // what the card feed gets
	ID        uuid.UUID // the card's id in the catalog
	Project   uuid.UUID // a property object's project; zero for a project card
	Published bool      // a property object's Published: only published objects get their project's boost
}

// IsProject reports whether c is a project card.
func (c card) IsProject() bool { return c.Project == uuid.Nil }

// newCatalog is the demo catalog in the table's order: two projects, each
// with three published objects and one that is not published.
func newCatalog() []card {
	var cards []card
	for _, p := range []struct{ label, title string }{{"A", "Riverside"}, {"B", "Hillview"}} {
		project := card{Label: p.label, Title: p.title, ID: uuid.New()}
		cards = append(cards, project)
		for i, published := range []bool{true, true, true, false} {
			label := p.label + string(rune('1'+i))
			cards = append(cards, card{Label: label, Title: p.title + " flat " + label, ID: uuid.New(), Project: project.ID, Published: published})
		}
	}
	return cards
}

// purchase is one purchase the demo makes, and what the purchase API last said of it.
type purchase struct {
	Label  string // P1, ...
	Target string // what it promotes, for a person: "Project A"
	Kind   event.TargetKind
	Weight int
	// Lasts is the time from its creation to its EndsAt.
	Lasts time.Duration
	// CancelAfter, when set, is when the demo cancels it, counted from its creation.
	CancelAfter time.Duration

	ID        uuid.UUID
	Status    event.Status
	CreatedAt time.Time // when the API answered the creation
	EndsAt    time.Time
	UpdatedAt time.Time // the purchase's UpdatedAt: its expiry's AsOf once it expired
}

// The demo's purchases, one per target kind (the live demo): a
// Project purchase that ends on its own, a PropertyObject one, one that is
// cancelled, and a Post-only one that the catalog ignores.
func newPurchases() []*purchase {
	return []*purchase{
		{Label: "P1", Target: "Project A", Kind: event.TargetProject, Weight: 10, Lasts: 20 * time.Second},
		{Label: "P2", Target: "PropertyObject B2", Kind: event.TargetPropertyObject, Weight: 5, Lasts: time.Hour},
		{Label: "P3", Target: "Project B", Kind: event.TargetProject, Weight: 3, Lasts: time.Hour, CancelAfter: 10 * time.Second},
		{Label: "P4", Target: "Post", Kind: event.TargetPost, Weight: 50, Lasts: time.Hour},
	}
}

// boosts is every card's PromotionBoost, in newCatalog's order.
type boosts [10]int

// What every card shows once each step's change went through: the demo waits
// for it on the catalog's reads, and its test checks it in PostgreSQL. An
// object's boost is its own purchases' plus its project's while it is
// published; A4 and B4 are not.
//
//	A   A1  A2  A3  A4   B  B1  B2  B3  B4
var (
	wantSeeded    = boosts{0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	wantP1        = boosts{10, 10, 10, 10, 0, 0, 0, 0, 0, 0}
	wantP2        = boosts{10, 10, 10, 10, 0, 0, 0, 5, 0, 0}
	wantP3        = boosts{10, 10, 10, 10, 0, 3, 3, 8, 3, 0}
	wantP4        = wantP3 // a Post belongs to the news context: no card changes
	wantCancelled = wantP2
	wantExpired   = boosts{0, 0, 0, 0, 0, 0, 0, 5, 0, 0}
)
