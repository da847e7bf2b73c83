// Package demo is the live demo of promoflow dev. It seeds a small catalog
// through the catalog's card feed, makes one purchase per target kind through
// the purchase API, and follows the cards' boosts through the catalog's reads
// while the pipeline carries each change: created, cascaded to a project's
// objects, a Post-only purchase ignored, cancelled, expired on time.
//
// It is a client of the two HTTP APIs, as a person with curl would be, and
// holds no rule of the product: what each card shows after each step is
// written down in scenario.go, and the demo waits until the catalog shows it.
package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/promoflow/promoflow/handlers/event"
)

// Config is what the demo talks to and who watches it.
type Config struct {
	// PromotionURL and CatalogURL are the two APIs, such as http://127.0.0.1:8080.
	PromotionURL, CatalogURL string
	// CatalogInternalURL is the catalog's internal listener, where its
	// /metrics is, such as http://127.0.0.1:9081.
	CatalogInternalURL string
	// APIToken is a tenant manager's bearer token; FeedToken the card feed's.
	APIToken, FeedToken string
	// Poll is how often the demo reads the cards and its purchases. Defaults to 200ms.
	Poll time.Duration
	// StepTimeout is the most time one step waits for the cards to show it. Defaults to 30s.
	StepTimeout time.Duration
	// OnEvent receives each event as the demo sees it. Defaults to none.
	OnEvent func(Event)
	// OnState receives every reading of the cards and purchases: the live table draws it. Defaults to none.
	OnState func(State)
	// OnStep, when set, is called once the cards show a step; the demo goes
	// on when it returns, and stops with its error. Its test checks the
	// database there.
	OnStep func(context.Context, Step) error
	// HTTP is the client of both APIs. Defaults to one with a 5s timeout.
	HTTP *http.Client
}

// Defaults of Config.
const (
	PollDefault        = 200 * time.Millisecond
	StepTimeoutDefault = 30 * time.Second
)

func (c *Config) setDefaults() {
	c.Poll = cmp.Or(c.Poll, PollDefault)
	c.StepTimeout = cmp.Or(c.StepTimeout, StepTimeoutDefault)
	if c.OnEvent == nil {
		c.OnEvent = func(Event) {}
	}
	if c.OnState == nil {
		c.OnState = func(State) {}
	}
	if c.HTTP == nil {
		c.HTTP = &http.Client{Timeout: 5 * time.Second}
	}
}

// Validate reports every missing or bad setting.
func (c Config) Validate() error {
	var errs []error
	if c.PromotionURL == "" || c.CatalogURL == "" || c.CatalogInternalURL == "" {
		errs = append(errs, errors.New("demo: both API URLs and the catalog's internal URL are required"))
	}
	if c.APIToken == "" || c.FeedToken == "" {
		errs = append(errs, errors.New("demo: an API token and the feed token are required"))
	}
	if c.Poll <= 0 || c.StepTimeout <= 0 {
		errs = append(errs, errors.New("demo: poll and step timeout must be > 0"))
	}
	return errors.Join(errs...)
}

// The kinds of Event.
const (
	EventSeeded    = "seeded"
	EventCreated   = "created"
	EventCascaded  = "cascaded" // a Project purchase reached the project and its published objects
	EventApplied   = "applied"  // a PropertyObject purchase reached its card
	EventIgnored   = "ignored"  // the catalog skipped a Post-only purchase
	EventCancelled = "cancelled"
	EventExpired   = "expired"
	EventDone      = "done"
)

// Event is one thing the demo saw happen.
type Event struct {
	At   time.Time
	Kind string
	// Purchase is the purchase's label (P1, ...) and PurchaseId its id; both empty for seeded and done.
	Purchase   string
	PurchaseId uuid.UUID
	// Text says it for a person.
	Text string
}

// Step is an event whose change the cards show, and what each card shows.
type Step struct {
	Event Event
	Cards []CardBoost
}

// CardBoost is one card and its PromotionBoost.
type CardBoost struct {
	Label   string
	ID      uuid.UUID
	Project bool
	Boost   int
}

// State is one reading of the demo's cards and purchases.
type State struct {
	At        time.Time
	Cards     []CardState
	Purchases []PurchaseState
}

// CardState is a card in the live table.
type CardState struct {
	Label, Title string
	Project      bool
	Published    bool
	Boost        int
	// Change is the boost's last change and ChangedAt when the demo saw it.
	Change    int
	ChangedAt time.Time
}

// PurchaseState is a purchase in the live table.
type PurchaseState struct {
	Label, Target string
	Kind          event.TargetKind
	Weight        int
	Status        event.Status
	EndsAt        time.Time
	// CancelAt is when the demo cancels it; zero for none.
	CancelAt time.Time
}

// Run plays the demo once; with an OnState, it then keeps the table fresh
// until ctx ends. It returns the first step that fails, and nil otherwise
// (ctx ending is no failure).
func Run(ctx context.Context, cfg Config) error {
	follow := cfg.OnState != nil
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	r := &run{cfg: cfg, api: client{http: cfg.HTTP, promotionURL: cfg.PromotionURL, catalogURL: cfg.CatalogURL, catalogInternalURL: cfg.CatalogInternalURL,
		apiToken: cfg.APIToken, feedToken: cfg.FeedToken}, cards: newCatalog(),
		boost: map[uuid.UUID]int{}, changes: map[uuid.UUID]CardState{}}
	err := r.play(ctx)
	if ctx.Err() != nil {
		return nil // stopped (Ctrl-C) mid-demo: not a failure
	}
	if err != nil {
		return err
	}
	for follow && ctx.Err() == nil { // the countdowns of the purchases left go on
		_ = r.read(ctx)
		sleep(ctx, time.Second)
	}
	return nil
}

// run is one play of the demo.
type run struct {
	cfg       Config
	api       client
	cards     []card
	purchases []*purchase
	boost     map[uuid.UUID]int
	changes   map[uuid.UUID]CardState
}

// play is the demo's script. Each step's want is in scenario.go.
func (r *run) play(ctx context.Context) error {
	for _, c := range r.cards {
		if err := r.api.putCard(ctx, c); err != nil {
			return fmt.Errorf("seed card %s: %w", c.Label, err)
		}
	}
	if err := r.step(ctx, Event{Kind: EventSeeded, Text: "2 projects, each with 3 published objects and 1 unpublished (A4, B4)"}, wantSeeded, nil); err != nil {
		return err
	}
	p1, p2, p3, p4 := r.plan(newPurchases())
	for _, b := range []struct {
		p    *purchase
		on   uuid.UUID
		kind string
		text string
		want boosts
	}{
		{p1, r.card("A").ID, EventCascaded, "Project A +10 reached A and its published objects A1-A3; unpublished A4 stays 0", wantP1},
		{p2, r.card("B2").ID, EventApplied, "PropertyObject B2 +5 reached B2 only", wantP2},
		{p3, r.card("B").ID, EventCascaded, "Project B +3 reached B and B1-B3; B2 shows its own 5 plus 3", wantP3},
	} {
		if err := r.create(ctx, b.p, b.on); err != nil {
			return err
		}
		if err := r.step(ctx, r.event(b.kind, b.p, b.text), b.want, nil); err != nil {
			return err
		}
	}

	ignoredBefore, err := r.api.postOnlyIgnored(ctx)
	if err != nil {
		return err
	}
	if err := r.create(ctx, p4, uuid.New()); err != nil {
		return err
	}
	postOnlySkipped := func() bool { n, err := r.api.postOnlyIgnored(ctx); return err == nil && n > ignoredBefore }
	if err := r.step(ctx, r.event(EventIgnored, p4, "Post-only: the catalog skipped it (posts are the news context's), no card changed"), wantP4, postOnlySkipped); err != nil {
		return err
	}

	r.waitUntil(ctx, p3.CreatedAt.Add(p3.CancelAfter))
	if err := r.api.cancel(ctx, p3); err != nil {
		return fmt.Errorf("cancel %s: %w", p3.Label, err)
	}
	if err := r.step(ctx, r.event(EventCancelled, p3, fmt.Sprintf("cancelled after %s: B and B1-B3 lost its 3, B2 keeps its own 5", p3.CancelAfter)), wantCancelled, nil); err != nil {
		return err
	}

	r.waitUntil(ctx, p1.EndsAt)
	expired := func() bool { return r.api.refresh(ctx, p1) == nil && p1.Status == event.StatusExpired }
	if err := r.await(ctx, EventExpired+" "+p1.Label, wantExpired, expired); err != nil {
		return err
	}
	if err := r.report(ctx, r.event(EventExpired, p1, expiredText(p1)), wantExpired); err != nil {
		return err
	}
	return r.step(ctx, Event{Kind: EventDone, Text: "the processes keep running: try the curl commands above; Ctrl-C stops"}, wantExpired, nil)
}

// plan shows the purchases in the table before they exist.
func (r *run) plan(ps []*purchase) (p1, p2, p3, p4 *purchase) {
	r.purchases = ps
	return ps[0], ps[1], ps[2], ps[3]
}

// create makes p on the card (or post) with id on, and reports it.
func (r *run) create(ctx context.Context, p *purchase, on uuid.UUID) error {
	if err := r.api.buy(ctx, p, on); err != nil {
		return fmt.Errorf("create %s: %w", p.Label, err)
	}
	text := fmt.Sprintf("%s +%d, %s, ends %s", p.Target, p.Weight, p.Status, p.EndsAt.Local().Format(time.TimeOnly))
	if p.CancelAfter > 0 {
		text += fmt.Sprintf(" (the demo cancels it after %s)", p.CancelAfter)
	}
	ev := r.event(EventCreated, p, text)
	ev.At = p.CreatedAt
	r.cfg.OnEvent(ev)
	return nil
}

func (r *run) event(kind string, p *purchase, text string) Event {
	return Event{Kind: kind, Purchase: p.Label, PurchaseId: p.ID, Text: text}
}

func (r *run) card(label string) card {
	i := slices.IndexFunc(r.cards, func(c card) bool { return c.Label == label })
	return r.cards[i]
}

// step waits until the cards show want (and done, when given, holds), then
// reports ev.
func (r *run) step(ctx context.Context, ev Event, want boosts, done func() bool) error {
	if err := r.await(ctx, ev.Kind+" "+ev.Purchase, want, done); err != nil {
		return err
	}
	return r.report(ctx, ev, want)
}

// await reads until the cards show want and done, when given, holds.
func (r *run) await(ctx context.Context, what string, want boosts, done func() bool) error {
	deadline := time.Now().Add(r.cfg.StepTimeout)
	for {
		err := r.read(ctx)
		if err == nil && r.shows(want) && (done == nil || done()) {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: the cards do not show it after %s: want %v, have %v (last read: %v)",
				what, r.cfg.StepTimeout, want, r.have(), err)
		}
		sleep(ctx, r.cfg.Poll)
	}
}

// report hands ev to OnEvent, and to OnStep with what each card shows.
func (r *run) report(ctx context.Context, ev Event, want boosts) error {
	ev.At = time.Now()
	r.cfg.OnEvent(ev)
	if r.cfg.OnStep == nil {
		return nil
	}
	s := Step{Event: ev}
	for i, c := range r.cards {
		s.Cards = append(s.Cards, CardBoost{Label: c.Label, ID: c.ID, Project: c.IsProject(), Boost: want[i]})
	}
	return r.cfg.OnStep(ctx, s)
}

// onTime is how late after its EndsAt the demo still calls an expiry on
// time: the expirer's wake-up runs a cycle at the earliest EndsAt, and
// re-reads it every second.
const onTime = 2 * time.Second

// expiredText says how long after its EndsAt the expirer expired p: its
// UpdatedAt is the expiry's AsOf, PostgreSQL's clock.
func expiredText(p *purchase) string {
	late := p.UpdatedAt.Sub(p.EndsAt)
	when := "on time"
	if late > onTime {
		when = "late"
	}
	return fmt.Sprintf("%s: EndsAt %s, Expired at %s (+%dms); A and A1-A3 lost its 10", when,
		p.EndsAt.Local().Format(time.TimeOnly+".000"), p.UpdatedAt.Local().Format(time.TimeOnly+".000"), late.Milliseconds())
}

// waitUntil keeps reading (and so the table fresh) until t.
func (r *run) waitUntil(ctx context.Context, t time.Time) {
	for ctx.Err() == nil && time.Now().Before(t) {
		_ = r.read(ctx)
		sleep(ctx, min(r.cfg.Poll, time.Until(t)))
	}
}

// read reads the cards' boosts and the purchases' statuses, and hands the
// reading to OnState.
func (r *run) read(ctx context.Context) error {
	got, err := r.api.readBoosts(ctx, r.cards)
	if err != nil {
		return err
	}
	for _, p := range r.purchases {
		if p.ID != uuid.Nil && !p.Status.Terminal() {
			if err := r.api.refresh(ctx, p); err != nil {
				return err
			}
		}
	}
	now := time.Now()
	for id, b := range got {
		if old, seen := r.boost[id]; seen && old != b {
			r.changes[id] = CardState{Change: b - old, ChangedAt: now}
		}
		r.boost[id] = b
	}
	r.cfg.OnState(r.state(now))
	return nil
}

func (r *run) state(now time.Time) State {
	s := State{At: now}
	for _, c := range r.cards {
		ch := r.changes[c.ID]
		s.Cards = append(s.Cards, CardState{Label: c.Label, Title: c.Title, Project: c.IsProject(), Published: c.Published,
			Boost: r.boost[c.ID], Change: ch.Change, ChangedAt: ch.ChangedAt})
	}
	for _, p := range r.purchases {
		ps := PurchaseState{Label: p.Label, Target: p.Target, Kind: p.Kind, Weight: p.Weight, Status: p.Status, EndsAt: p.EndsAt}
		if p.CancelAfter > 0 && !p.CreatedAt.IsZero() {
			ps.CancelAt = p.CreatedAt.Add(p.CancelAfter)
		}
		s.Purchases = append(s.Purchases, ps)
	}
	return s
}

func (r *run) shows(want boosts) bool {
	for i, c := range r.cards {
		if b, ok := r.boost[c.ID]; !ok || b != want[i] {
			return false
		}
	}
	return true
}

func (r *run) have() boosts {
	var h boosts
	for i, c := range r.cards {
		h[i] = r.boost[c.ID]
	}
	return h
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
