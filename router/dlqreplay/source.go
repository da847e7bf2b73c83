package dlqreplay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/bounded"
)

// errCapReached stops a partition once Max records were sent.
var errCapReached = errors.New("replay cap reached")

// source is the forwarder's subscriber: a member of the replay's consumer
// group that reads each partition of the DLQ up to its end at the start, hands
// the forwarder an envelope per record to replay, and marks a record's offset
// once it is forwarded, skipped by the filter or parked. It must own every
// partition: a second member means a second replay, and it refuses.
type source struct {
	cfg        Config
	client     *bounded.Client // fetches the records of dead letters by reference
	progress   *bounded.Progress
	partitions int
	ranges     map[int32]bounded.Range
	pace       *pacer
	out        chan *message.Message
	sent       atomic.Int64

	mu       sync.Mutex
	pending  map[int32]bool
	failure  error
	stop     context.CancelFunc
	finished chan struct{} // closed once the group was left
	closing  sync.Once
}

func newSource(cfg Config, client *bounded.Client, progress *bounded.Progress, partitions int, ranges []bounded.Range) *source {
	s := &source{cfg: cfg, client: client, progress: progress, partitions: partitions, pace: newPacer(cfg.Rate),
		ranges: map[int32]bounded.Range{}, pending: map[int32]bool{},
		out: make(chan *message.Message), stop: func() {}, finished: make(chan struct{})}
	for _, r := range ranges {
		s.ranges[r.Partition] = r
		s.pending[r.Partition] = true
	}
	return s
}

// Subscribe joins the group and streams envelopes until every partition is
// done, the cap is reached, or the replay fails; then it leaves the group and
// closes finished. The channel closes with Close, when the forwarder stops.
func (s *source) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	sc := s.cfg.Kafka.ClientConfig("promoflow-dlq-replay")
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	group, err := sarama.NewConsumerGroup(s.cfg.Kafka.Brokers, s.cfg.Group, sc)
	if err != nil {
		return nil, fmt.Errorf("join group %s: %w", s.cfg.Group, err)
	}
	ctx, stop := context.WithCancel(ctx)
	s.mu.Lock()
	s.stop = stop
	s.mu.Unlock()
	go func() {
		defer close(s.finished)
		defer group.Close() // leaves the group, so the next replay may join at once
		for ctx.Err() == nil {
			if err := group.Consume(ctx, []string{topic}, s); err != nil && ctx.Err() == nil {
				s.fail(fmt.Errorf("consume %s in group %s: %w", topic, s.cfg.Group, err))
				return
			}
		}
	}()
	return s.out, nil
}

// Close stops the group, waits for it to leave, and closes the channel.
func (s *source) Close() error {
	s.mu.Lock()
	stop := s.stop
	s.mu.Unlock()
	stop()
	select {
	case <-s.finished:
	case <-time.After(30 * time.Second):
		return errors.New("the replay's consumer group did not stop within 30s")
	}
	s.closing.Do(func() { close(s.out) })
	return nil
}

func (s *source) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failure
}

func (s *source) fail(err error) {
	s.mu.Lock()
	if s.failure == nil {
		s.failure = err
	}
	stop := s.stop
	s.mu.Unlock()
	stop()
}

// Setup refuses a session that does not own every partition: another member
// (another replay) joined the group.
func (s *source) Setup(sess sarama.ConsumerGroupSession) error {
	if got := len(sess.Claims()[s.cfg.DLQTopic]); got < s.partitions {
		err := fmt.Errorf("%w: group %s gave this replay %d of %d partitions", ErrGroupBusy, s.cfg.Group, got, s.partitions)
		s.fail(err)
		return err
	}
	return nil
}

// Cleanup commits what was marked before the session ends.
func (s *source) Cleanup(sess sarama.ConsumerGroupSession) error {
	sess.Commit()
	return nil
}

// ConsumeClaim replays one partition's range, then holds the claim until the
// session ends: returning earlier would end the session of every partition.
func (s *source) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	p := claim.Partition()
	s.mu.Lock()
	r, todo := s.ranges[p], s.pending[p]
	s.mu.Unlock()
	if todo {
		r.From = max(r.From, claim.InitialOffset())
		err := bounded.ReadRange(sess.Context(), r, claim.Messages(), nil, s.handle(sess), s.progress)
		switch {
		case err == nil:
			s.done(sess, p)
		case errors.Is(err, errCapReached):
			s.finish(sess)
		case sess.Context().Err() != nil:
			// The session ended; the next one resumes from the committed offset.
		default:
			s.fail(err)
		}
	}
	<-sess.Context().Done()
	return nil
}

func (s *source) done(sess sarama.ConsumerGroupSession, p int32) {
	s.mu.Lock()
	delete(s.pending, p)
	all := len(s.pending) == 0
	s.mu.Unlock()
	if all {
		s.finish(sess)
	}
}

// finish commits every marked offset, then ends the session.
func (s *source) finish(sess sarama.ConsumerGroupSession) {
	sess.Commit()
	s.mu.Lock()
	stop := s.stop
	s.mu.Unlock()
	stop()
}

func (s *source) handle(sess sarama.ConsumerGroupSession) bounded.Handler {
	return func(ctx context.Context, rec *sarama.ConsumerMessage) error {
		msg, err := kafka.DefaultMarshaler{}.Unmarshal(rec)
		if err != nil {
			return fmt.Errorf("unmarshal %s/%d@%d: %w", rec.Topic, rec.Partition, rec.Offset, err)
		}
		v, err := s.cfg.checkLedger(ctx, rec, msg, s.cfg.decide(msg))
		if err != nil {
			return err
		}
		out, key := msg, rec.Key
		if v == replay {
			out, key, err = s.cfg.dereference(ctx, s.client, rec, msg)
			if errors.Is(err, errBrokenReference) {
				v = broken
			} else if err != nil {
				return err
			}
		}
		if v == replay && s.cfg.Max > 0 && s.sent.Add(1) > s.cfg.Max {
			return errCapReached // left unmarked: the next run starts here
		}
		s.progress.Read.Add(1)
		switch v {
		case park:
			s.progress.Matched.Add(1)
			s.progress.Parked.Add(1)
			s.cfg.Log.Warn("parked", "partition", rec.Partition, "offset", rec.Offset, "MessageId", msg.UUID,
				"PurchaseId", msg.Metadata.Get(event.HeaderAggregateID), "replays", replays(msg),
				"code", msg.Metadata.Get(middleware.HeaderDLQErrorCode))
		case broken:
			s.progress.Matched.Add(1)
			s.progress.Skipped.Add(1)
			s.cfg.Log.Warn("skipped", "partition", rec.Partition, "offset", rec.Offset, "MessageId", msg.UUID,
				"PurchaseId", msg.Metadata.Get(event.HeaderAggregateID), "error", err.Error())
		case done:
			s.progress.Matched.Add(1)
			s.progress.Skipped.Add(1)
			s.cfg.Log.Info("skipped: replayed already (--force replays it again)", "partition", rec.Partition, "offset", rec.Offset,
				"MessageId", msg.UUID, "PurchaseId", msg.Metadata.Get(event.HeaderAggregateID))
		case replay:
			s.progress.Matched.Add(1)
			err := s.cfg.replayOnce(ctx, originOf(rec, msg), func() error { return s.forward(ctx, rec, out, key) })
			if errors.Is(err, errReplayedMeanwhile) {
				s.progress.Skipped.Add(1)
				s.cfg.Log.Info("skipped: replayed by another run meanwhile", "partition", rec.Partition, "offset", rec.Offset,
					"MessageId", msg.UUID, "PurchaseId", msg.Metadata.Get(event.HeaderAggregateID))
			} else if err != nil {
				return err
			}
		}
		sess.MarkOffset(rec.Topic, rec.Partition, rec.Offset+1, "")
		return nil
	}
}

// forward hands the forwarder one envelope and waits for its publish.
// msg is what to replay under key: the dead letter, or the record it refers to.
func (s *source) forward(ctx context.Context, rec *sarama.ConsumerMessage, msg *message.Message, key []byte) error {
	if err := s.pace.wait(ctx); err != nil {
		return err
	}
	msg.SetContext(ctx)
	env, err := envelope(s.cfg.ReplayTopic, msg, key)
	if err != nil {
		return fmt.Errorf("wrap %s/%d@%d: %w", rec.Topic, rec.Partition, rec.Offset, err)
	}
	select {
	case s.out <- env:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-env.Acked():
		return nil
	case <-env.Nacked():
		return fmt.Errorf("publish %s/%d@%d to %s failed (see the log); the records before it are committed",
			rec.Topic, rec.Partition, rec.Offset, s.cfg.ReplayTopic)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wait blocks until the rate limit lets the next record go.
func (p *pacer) wait(ctx context.Context) error {
	if p.every == 0 {
		return nil
	}
	p.mu.Lock()
	now := time.Now()
	at := p.next
	if at.Before(now) {
		at = now
	}
	p.next = at.Add(p.every)
	p.mu.Unlock()
	if d := at.Sub(now); d > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
	return nil
}
