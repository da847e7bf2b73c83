package expire

import (
	"cmp"
	"errors"
	"time"

	"github.com/promoflow/promoflow/handlers/event"
)

// Defaults of Config, from the seed's schedule table.
const (
	IntervalDefault     = 60 * time.Second
	BatchSizeDefault    = 200
	MaxDurationDefault  = 30 * time.Second
	BatchTimeoutDefault = 15 * time.Second
	WakeupPollDefault   = time.Second
	ConcurrencyDefault  = 2
)

// Config tunes the expirer.
type Config struct {
	// Interval is the time between cycles, the ticker's heartbeat (seed range
	// 1m..5m). Defaults to 60s.
	Interval time.Duration
	// BatchSize is the most purchases one transaction expires. Defaults to 200.
	BatchSize int
	// MaxDuration bounds one cycle; what is left is taken by the next. Defaults to 30s.
	MaxDuration time.Duration
	// BatchTimeout bounds one batch transaction. A batch under way when the
	// process stops runs on to commit within it, or rolls back whole. Defaults to 15s.
	BatchTimeout time.Duration
	// Concurrency is how many batch transactions of a cycle run at once, on
	// disjoint rows (SKIP LOCKED). Defaults to 2.
	Concurrency int
	// Topic is the event's destination topic. Defaults to event.Topic.
	Topic string
	// WakeupPoll is how often the Wakeup re-reads the earliest upcoming EndsAt,
	// so that a purchase created on any instance re-arms it within this time.
	// Defaults to 1s.
	WakeupPoll time.Duration
	// DisableWakeup leaves cycles to the ticker alone: a purchase then expires
	// up to an interval after its EndsAt.
	DisableWakeup bool
}

// Validate reports every out-of-range setting.
func (c Config) Validate() error {
	c.setDefaults() // a copy: what the component will run with
	var errs []error
	if c.Interval <= 0 {
		errs = append(errs, errors.New("expire interval must be positive"))
	}
	if c.BatchSize < 1 || c.BatchSize > 10_000 {
		errs = append(errs, errors.New("expire batch size must be within 1..10000"))
	}
	if c.Concurrency < 1 || c.Concurrency > 16 {
		errs = append(errs, errors.New("expire concurrency must be within 1..16"))
	}
	if c.MaxDuration <= 0 {
		errs = append(errs, errors.New("expire max duration must be positive"))
	}
	if c.BatchTimeout <= 0 {
		errs = append(errs, errors.New("expire batch timeout must be positive"))
	}
	if c.WakeupPoll <= 0 {
		errs = append(errs, errors.New("expire wake-up poll must be positive"))
	}
	return errors.Join(errs...)
}

func (c *Config) setDefaults() {
	c.Interval = cmp.Or(c.Interval, IntervalDefault)
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.MaxDuration = cmp.Or(c.MaxDuration, MaxDurationDefault)
	c.Concurrency = cmp.Or(c.Concurrency, ConcurrencyDefault)
	c.BatchTimeout = cmp.Or(c.BatchTimeout, BatchTimeoutDefault)
	c.Topic = cmp.Or(c.Topic, event.Topic)
	c.WakeupPoll = cmp.Or(c.WakeupPoll, WakeupPollDefault)
}
