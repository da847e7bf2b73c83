// Package audit finds and repairs divergence between the catalog's
// PromotionBoost projection and its sources: every card's boost against the
// sum of its active contributions in the replica (one SQL pass), and, on
// demand, the replica against the latest event of each purchase on the
// compacted purchase topic.
package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// Defaults of Config.
const (
	// SamplesDefault is how many drifted ids a report names.
	SamplesDefault = 10
	// RepairBatchDefault is how many cards one repair transaction takes.
	RepairBatchDefault = 500
)

// Config configures an Auditor. The card check needs DB alone; the replica
// check also reads Topic through Kafka and needs ConsumerGroup.
type Config struct {
	DB            *sqlx.DB
	Kafka         kafkakit.Cluster
	Topic         string // defaults to event.Topic
	ConsumerGroup string // the catalog consumer's: records it has not consumed yet are pending, not drift
	// Samples is how many drifted ids a report names (SamplesDefault), and
	// RepairBatch how many cards one repair transaction takes (RepairBatchDefault).
	Samples, RepairBatch int
	// Log receives the audit's records. Defaults to slog.Default().
	Log *slog.Logger
}

// Validate reports every missing or out-of-range setting.
func (c Config) Validate() error {
	c.setDefaults() // a copy: what the component will run with
	var errs []error
	if c.DB == nil {
		errs = append(errs, errors.New("audit: database is required"))
	}
	if c.Samples < 1 || c.RepairBatch < 1 {
		errs = append(errs, errors.New("audit: samples and repair batch must be >= 1"))
	}
	return errors.Join(errs...)
}

func (c *Config) setDefaults() {
	c.Topic = cmp.Or(c.Topic, event.Topic)
	c.Samples = cmp.Or(c.Samples, SamplesDefault)
	c.RepairBatch = cmp.Or(c.RepairBatch, RepairBatchDefault)
	c.Log = cmp.Or(c.Log, slog.Default())
}

// Auditor checks and repairs the projection.
type Auditor struct {
	cfg Config
	// Test seam, run once the replica check read the topic's end offsets.
	afterEnds func(context.Context) error
	// check parses and checks each record read (boost.LoaderConfig.Check);
	// nil: as the consumer does. A test seam (export_test.go).
	check func(key, value []byte) (event.PurchaseChanged, error)
}

// New validates cfg (after defaults) and returns an Auditor.
func New(cfg Config) (*Auditor, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Auditor{cfg: cfg}, nil
}

// CardsReport is the cards' check.
type CardsReport struct {
	// Checked cards, of which Drifted have a boost other than the replica's sum.
	Checked int64             `json:"checked"`
	Drifted int               `json:"drifted"`
	Samples []boost.CardDrift `json:"samples,omitempty"`
	// Repaired is how many cards a repair changed.
	Repaired int `json:"repaired"`
	drift    []boost.CardDrift
}

// Cards compares every card's boost with the replica's sum. One statement's
// snapshot: an event commits its contributions and card deltas together, so
// a live consumer never shows as drift.
func (a *Auditor) Cards(ctx context.Context) (CardsReport, error) {
	var r CardsReport
	if err := a.cfg.DB.GetContext(ctx, &r.Checked, `SELECT (SELECT count(*) FROM catalog.project_cards)
		+ (SELECT count(*) FROM catalog.property_object_cards)`); err != nil {
		return r, fmt.Errorf("count cards: %w", err)
	}
	drift, err := boost.Drift(ctx, a.cfg.DB)
	if err != nil {
		return r, err
	}
	r.drift, r.Drifted = drift, len(drift)
	r.Samples = drift[:min(len(drift), a.cfg.Samples)]
	return r, nil
}

// Repair recomputes the drifted cards of r as a card upsert would, batch by
// batch, safe while the consumer runs; a batch that meets a concurrent move
// of a card is tried again.
func (a *Auditor) Repair(ctx context.Context, r *CardsReport) error {
	for start := 0; start < len(r.drift); start += a.cfg.RepairBatch {
		batch := r.drift[start:min(start+a.cfg.RepairBatch, len(r.drift))]
		n, err := a.repairBatch(ctx, batch)
		if err != nil {
			return err
		}
		r.Repaired += n
	}
	a.cfg.Log.Info("cards repaired", "drifted", r.Drifted, "repaired", r.Repaired)
	return nil
}

func (a *Auditor) repairBatch(ctx context.Context, batch []boost.CardDrift) (int, error) {
	for attempt := 1; ; attempt++ {
		tx, err := a.cfg.DB.BeginTxx(ctx, nil)
		if err != nil {
			return 0, fmt.Errorf("begin repair: %w", err)
		}
		n, err := boost.RepairTx(ctx, tx, batch)
		if err == nil {
			err = tx.Commit()
		}
		if err == nil {
			return n, nil
		}
		_ = tx.Rollback()
		if !errors.Is(err, boost.ErrConflict) || attempt == 5 {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
		}
	}
}
