package outbox

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// StepBack lets a relay process go of the outbox position while it cannot
// publish, so that another relay process takes the position over.
//
// The position is the offsets row that the relay's transaction locks FOR
// UPDATE (watermill-sql's offsets adapter): whoever holds that transaction
// relays, the others wait on the lock. A holder that cannot reach Kafka
// while its database stays healthy would hold it for ever, publishing
// nothing. With StepBack, after a failed publish (the publisher bounds each
// publish, see kafkakit.BatchPublisher):
//
//   - its handler middleware holds what the relay still holds, without
//     publishing it, until the subscriber's ack deadline ends the
//     transaction without an ack, and the lock passes to a waiting process;
//   - its schema adapter selects nothing (RelaySchema), so the process's
//     polls take no lock and it does not queue for the position again;
//   - it comes back after a pause (Pause, doubling with each failure in a
//     row, up to MaxPause) once Probe says the destination answers: a
//     process cut off from Kafka stays back however long the cut lasts.
//
// Nothing here begins or ends a transaction.
type StepBack struct {
	cfg StepBackConfig

	mu     sync.Mutex
	back   bool
	pause  time.Duration // the next pause
	wake   chan struct{} // closed by Close
	closed bool
	probes sync.WaitGroup
}

// StepBackConfig configures a StepBack.
type StepBackConfig struct {
	// Pause is the first pause after a failed publish. Defaults to 2s.
	Pause time.Duration
	// MaxPause caps the pause, which doubles with each failed publish in a
	// row. Defaults to 15s.
	MaxPause time.Duration
	// Probe, when set, must succeed before the relay reads the outbox
	// again; it is retried after each pause. Optional.
	Probe func(context.Context) error
	// Excuse, when set, names the failed publishes that are not the
	// destination's fault, such as one refused for a lost position
	// (PositionGuard): they do not make the relay step back. Optional.
	Excuse func(error) bool
	// Hold, when set, keeps the relay back while it answers an error (such
	// as TopicGuard.Blocked): no pause, no probe; the relay reads again
	// once it answers nil. Optional.
	Hold func() error
	// OnChange is told when the relay steps back (with the publish's
	// error and the pause) and when it comes back (nil, 0). Optional.
	OnChange func(back bool, cause error, pause time.Duration)
	// PublishTimeout is the most a publish takes. A message whose context
	// ends sooner (the subscriber's ack deadline) is nacked without one, so
	// that no publish is under way when the subscriber gives the position
	// up: one that succeeded then would be sent again by the next holder.
	// Zero: no such check.
	PublishTimeout time.Duration
}

// Defaults of StepBackConfig.
const (
	StepBackPauseDefault    = 2 * time.Second
	StepBackMaxPauseDefault = 15 * time.Second
)

// ErrSteppedBack is what the relay's handler answers, without publishing,
// while the relay stands back.
var ErrSteppedBack = errors.New("the relay stands back from the outbox position: its last publish failed")

// ErrNoTimeToPublish is what the relay's handler answers, without
// publishing, when the message's ack deadline is nearer than a publish may take.
var ErrNoTimeToPublish = errors.New("the message's ack deadline leaves no time for a publish")

func (c *StepBackConfig) setDefaults() {
	c.Pause = cmp.Or(c.Pause, StepBackPauseDefault)
	c.MaxPause = cmp.Or(c.MaxPause, StepBackMaxPauseDefault)
}

// Validate reports every out-of-range setting.
func (c StepBackConfig) Validate() error {
	c.setDefaults()
	var errs []error
	if c.Pause <= 0 {
		errs = append(errs, errors.New("step-back pause must be positive"))
	}
	if c.MaxPause < c.Pause {
		errs = append(errs, errors.New("step-back max pause must be at least the pause"))
	}
	if c.PublishTimeout < 0 {
		errs = append(errs, errors.New("step-back publish timeout must not be negative"))
	}
	return errors.Join(errs...)
}

// NewStepBack returns a StepBack that stands in.
func NewStepBack(cfg StepBackConfig) (*StepBack, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &StepBack{cfg: cfg, pause: cfg.Pause, wake: make(chan struct{})}, nil
}

// Back reports whether the relay stands back now.
func (s *StepBack) Back() bool { return s.refusal() != nil }

// refusal is why the relay stands back now, nil when it does not.
func (s *StepBack) refusal() error {
	s.mu.Lock()
	back := s.back
	s.mu.Unlock()
	if back {
		return ErrSteppedBack
	}
	if s.cfg.Hold != nil {
		return s.cfg.Hold()
	}
	return nil
}

// Publisher wraps the relay's publisher: a failed publish makes the relay
// step back, a successful one resets the pause.
func (s *StepBack) Publisher(pub message.Publisher) message.Publisher {
	return stepBackPublisher{Publisher: pub, s: s}
}

type stepBackPublisher struct {
	message.Publisher
	s *StepBack
}

func (p stepBackPublisher) Publish(topic string, msgs ...*message.Message) error {
	return p.s.observe(p.Publisher.Publish(topic, msgs...))
}

// Pages wraps the relay's pages (PageTransaction): a failed commit of a
// page makes the relay step back as a failed publish does.
func (s *StepBack) Pages(pages Pages) Pages {
	return stepBackPages{Pages: pages, s: s}
}

type stepBackPages struct {
	Pages
	s *StepBack
}

func (p stepBackPages) EndPage(commit bool) error {
	err := p.Pages.EndPage(commit)
	if commit {
		return p.s.observe(err)
	}
	return err
}

// observe steps back after err, a failed publish that is not excused, and
// resets the pause after a successful one; it returns err.
func (s *StepBack) observe(err error) error {
	if err != nil {
		if s.cfg.Excuse == nil || !s.cfg.Excuse(err) {
			s.stepBack(err)
		}
		return err
	}
	s.mu.Lock()
	s.pause = s.cfg.Pause
	s.mu.Unlock()
	return nil
}

// Middleware does not call the handler while the relay stands back (it
// answers why: ErrSteppedBack, or Hold's error), or
// when the message's context ends within PublishTimeout: it waits until
// the message's context ends (the subscriber then ends its transaction
// without an ack), and nacks.
func (s *StepBack) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		refused := s.refusal()
		if deadline, ok := msg.Context().Deadline(); refused == nil && ok && s.cfg.PublishTimeout > 0 && time.Until(deadline) < s.cfg.PublishTimeout {
			refused = ErrNoTimeToPublish
		}
		if refused == nil {
			return h(msg)
		}
		<-msg.Context().Done()
		return nil, refused
	}
}

// Close ends a pause under way; the relay then stays back.
func (s *StepBack) Close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.wake)
	}
	s.mu.Unlock()
	s.probes.Wait()
}

func (s *StepBack) stepBack(cause error) {
	s.mu.Lock()
	if s.back || s.closed {
		s.mu.Unlock()
		return
	}
	s.back = true
	pause := s.pause
	s.pause = min(2*s.pause, s.cfg.MaxPause)
	s.probes.Add(1)
	s.mu.Unlock()
	if s.cfg.OnChange != nil {
		s.cfg.OnChange(true, cause, pause)
	}
	go s.comeBack(pause)
}

// comeBack waits out the pause, then until Probe succeeds (retried after
// each pause), and lets the relay read the outbox again.
func (s *StepBack) comeBack(pause time.Duration) {
	defer s.probes.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.wake:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		if s.cfg.Probe == nil || s.cfg.Probe(ctx) == nil {
			break
		}
	}
	s.mu.Lock()
	s.back = false
	s.mu.Unlock()
	if s.cfg.OnChange != nil {
		s.cfg.OnChange(false, nil, 0)
	}
}
