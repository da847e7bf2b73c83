package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
)

// TopicGuard keeps the relay off its topic while the topic is not the one
// the relay's keys were hashed over:
//
//   - missing (deleted under the relay): producers of ours never create a
//     topic, so every publish fails, and the relay stands back with the rows
//     in the outbox until the topic is created again;
//   - another partition count than the pinned one (TopicPinsTable, the
//     count the first check saw), or not compacted: the relay publishes
//     nothing until an operator puts a topic as it was in place (a key's
//     partition is its hash modulo the pinned count, so adding partitions
//     in place can only leave new ones empty; a topic with fewer could lose a
//     key's partition, and one that is not compacted loses a rebuild's
//     history to retention).
//
// It checks the topic every Interval, and at once when Wake is called (on a
// step-back) or Check is (the step-back's probe). Until its first check
// succeeds it holds the relay too (ErrTopicUnchecked). Nothing here talks
// to Kafka (Describe does) or begins a transaction beyond its pin's.
type TopicGuard struct {
	cfg TopicGuardConfig

	checking sync.Mutex // one check at a time, so verdicts change in order
	mu       sync.Mutex
	pins     map[string]int32 // of every topic, for rows that name another
	verdict  error

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
}

// TopicGuardConfig configures a TopicGuard.
type TopicGuardConfig struct {
	// Topic is the topic guarded. Required.
	Topic string
	// DB holds the pins (TopicPinsTable). Required.
	DB *sqlx.DB
	// Describe reads the topic as the cluster has it now. Required.
	Describe func(ctx context.Context) (TopicShape, error)
	// Interval is the time between checks. Defaults to 30s.
	Interval time.Duration
	// OnChange is told each new verdict: nil once the topic is as pinned,
	// ErrTopicMissing, or a *TopicChangedError. Optional.
	OnChange func(verdict error, pinned int32)
	// OnError is told each check that could not read the topic or its pin,
	// and whether the relay is held meanwhile (the verdict stays as it
	// was: before a first good check, it holds). Optional.
	OnError func(err error, holding bool)
}

// TopicCheckIntervalDefault is TopicGuardConfig.Interval's default.
const TopicCheckIntervalDefault = 30 * time.Second

// topicRecheckMax bounds the time between checks while the guard holds the
// relay: the relay resumes within it once the topic is right again.
const topicRecheckMax = 2 * time.Second

// TopicShape is a topic as the cluster has it now (the fields of
// kafkakit.TopicState, which converts to it).
type TopicShape struct {
	// Missing is set when the cluster has no such topic.
	Missing bool
	// Partitions is its partition count.
	Partitions int32
	// Policies is its cleanup.policy, such as ["compact"].
	Policies []string
}

// compacted reports whether a record leaves only when a newer record of its
// key replaces it: "compact" without "delete", which would drop it after the
// retention too.
func (s TopicShape) compacted() bool {
	return slices.Contains(s.Policies, "compact") && !slices.Contains(s.Policies, "delete")
}

// ErrTopicMissing is a topic the cluster does not have.
var ErrTopicMissing = errors.New("the relay's topic does not exist")

// ErrTopicUnchecked holds the relay until its topic was checked once.
var ErrTopicUnchecked = errors.New("the relay's topic was not checked yet")

// TopicChangedError is a topic whose partition count is not the pinned one,
// or that is not compacted.
type TopicChangedError struct {
	Topic string
	// Pinned is the count the relay hashes keys over; Partitions the
	// topic's now.
	Pinned, Partitions int32
	// CleanupPolicy is the topic's cleanup.policy now.
	CleanupPolicy string
}

func (e *TopicChangedError) Error() string {
	return fmt.Sprintf("topic %s has %d partitions (pinned %d) and cleanup.policy=%s (want %d and compact)",
		e.Topic, e.Partitions, e.Pinned, e.CleanupPolicy, e.Pinned)
}

// JudgeTopic is the verdict on a topic of this shape and pinned count: nil
// when the relay may publish to it, else ErrTopicMissing or a
// *TopicChangedError.
func JudgeTopic(topic string, shape TopicShape, pinned int32) error {
	switch {
	case shape.Missing:
		return fmt.Errorf("topic %s: %w", topic, ErrTopicMissing)
	case shape.Partitions != pinned || !shape.compacted():
		return &TopicChangedError{Topic: topic, Pinned: pinned, Partitions: shape.Partitions, CleanupPolicy: strings.Join(shape.Policies, ",")}
	}
	return nil
}

func (c *TopicGuardConfig) setDefaults() {
	c.Interval = cmp.Or(c.Interval, TopicCheckIntervalDefault)
}

// Validate reports every missing or out-of-range setting.
func (c TopicGuardConfig) Validate() error {
	c.setDefaults()
	var errs []error
	if c.Topic == "" {
		errs = append(errs, errors.New("topic guard: the topic is required"))
	}
	if c.DB == nil {
		errs = append(errs, errors.New("topic guard: the database is required"))
	}
	if c.Describe == nil {
		errs = append(errs, errors.New("topic guard: describe is required"))
	}
	if c.Interval <= 0 {
		errs = append(errs, errors.New("topic check interval must be positive"))
	}
	return errors.Join(errs...)
}

// NewTopicGuard starts a guard; its first check runs at once. Close stops it.
func NewTopicGuard(cfg TopicGuardConfig) (*TopicGuard, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := &TopicGuard{cfg: cfg, verdict: ErrTopicUnchecked,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go g.run()
	return g, nil
}

// Blocked is the reason the relay may not publish now, nil when it may.
func (g *TopicGuard) Blocked() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.verdict
}

// Pinned is the partition count to hash topic's keys over: its pinned one
// as of the last check, else 0 (the topic's current count). Any topic's: an
// outbox row names its topic when it is written, so rows written before the
// purchase topic was moved to a new one still go to the old one, and keep
// their keys' partitions there.
func (g *TopicGuard) Pinned(topic string) int32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pins[topic]
}

// Wake asks for a check now; it does not wait for it.
func (g *TopicGuard) Wake() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// Check checks the topic now and returns the verdict (nil: the relay may
// publish), or the error that kept it from reading the topic or its pin;
// the verdict then stays as it was.
func (g *TopicGuard) Check(ctx context.Context) error {
	g.checking.Lock()
	defer g.checking.Unlock()
	verdict, err := g.check(ctx)
	if err != nil {
		err = fmt.Errorf("check topic %s: %w", g.cfg.Topic, err)
		if g.cfg.OnError != nil && ctx.Err() == nil {
			g.cfg.OnError(err, g.Blocked() != nil)
		}
		return err
	}
	return verdict
}

// check judges the topic and records the verdict; err is a check that
// could not read the topic or its pin.
func (g *TopicGuard) check(ctx context.Context) (verdict, err error) {
	shape, err := g.cfg.Describe(ctx)
	if err != nil {
		return nil, err
	}
	// Read each time: the pin is the database's, whichever process wrote it.
	var pinned int32
	if shape.Missing {
		pinned, _, err = PinnedPartitions(ctx, g.cfg.DB, g.cfg.Topic)
	} else {
		// The first count seen stays pinned, whichever process saw it.
		pinned, err = PinPartitions(ctx, g.cfg.DB, g.cfg.Topic, shape.Partitions)
	}
	if err != nil {
		return nil, err
	}
	pins, err := Pins(ctx, g.cfg.DB)
	if err != nil {
		return nil, err
	}
	verdict = JudgeTopic(g.cfg.Topic, shape, pinned)
	g.mu.Lock()
	changed := !sameVerdict(g.verdict, verdict)
	g.pins, g.verdict = pins, verdict
	g.mu.Unlock()
	if changed && g.cfg.OnChange != nil {
		g.cfg.OnChange(verdict, pinned)
	}
	return verdict, nil
}

// sameVerdict reports whether two verdicts say the same, so that OnChange
// hears each change once.
func sameVerdict(a, b error) bool {
	var ca, cb *TopicChangedError
	switch {
	case errors.As(a, &ca) && errors.As(b, &cb):
		return *ca == *cb
	case errors.Is(a, ErrTopicMissing) || errors.Is(b, ErrTopicMissing):
		return errors.Is(a, ErrTopicMissing) && errors.Is(b, ErrTopicMissing)
	}
	return a == b
}

// Close stops the checks.
func (g *TopicGuard) Close() {
	select {
	case <-g.stop:
	default:
		close(g.stop)
	}
	<-g.done
}

func (g *TopicGuard) run() {
	defer close(g.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-g.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		_ = g.Check(ctx) // a failed check leaves the verdict; the next one retries
		next := g.cfg.Interval
		if g.Blocked() != nil {
			next = min(next, topicRecheckMax)
		}
		select {
		case <-g.stop:
			return
		case <-g.wake:
		case <-time.After(next):
		}
	}
}
