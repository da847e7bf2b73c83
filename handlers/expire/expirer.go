// Package expire is ExpirePromotionsJob: one cycle moves every Active purchase
// with EndsAt <= AsOf to Expired, batch by batch, and writes one Expired event
// per purchase into the outbox in the batch's transaction. The cycle policy
// lives here; every statement on promotion_purchases lives in
// handlers/purchase.
package expire

import (
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel"
)

// tracer names the expirer's spans; it follows the global provider.
var tracer = otel.Tracer("github.com/promoflow/promoflow/handlers/expire")

// Result is what one cycle did; the router turns it into metrics.
type Result struct {
	RunID              string
	AsOf               time.Time
	Batches            int
	ExpiredCount       int
	PoisonCount        int
	SkippedLockedCount int
	// Backlog is the due Active purchases left when the cycle ended.
	Backlog int
	// Delays are AsOf − EndsAt of each purchase the cycle expired: how late
	// past its paid EndsAt the purchase stopped being Active.
	Delays   []time.Duration
	Duration time.Duration
	// Interrupted is set when the process stopped the cycle between batches.
	Interrupted bool
	// Cut is set when MaxDuration ended the cycle while its batches still
	// came full: the next cycle takes the due purchases left.
	Cut bool
}

// Expirer runs expiry cycles. Instances in several processes cooperate through
// row locks alone (no global lock, ADR-0056).
type Expirer struct {
	db  *sqlx.DB
	cfg Config
	log *slog.Logger
	// Now is the process's clock. It decides nothing: AsOf and the wake-up
	// read the database's clock (clock.go). A cycle logs how far Now runs
	// from it (clockSkew), so an instance with a wrong clock shows. Defaults
	// to time.Now.
	Now func() time.Time
}

// New validates cfg (after defaults) and returns an Expirer.
func New(db *sqlx.DB, cfg Config, log *slog.Logger) (*Expirer, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Expirer{db: db, cfg: cfg, log: log, Now: time.Now}, nil
}

// Interval is the time between cycles.
func (e *Expirer) Interval() time.Duration { return e.cfg.Interval }
