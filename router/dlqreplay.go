package router

import (
	"cmp"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
)

// DLQReplayGroupPrefix names the replay's consumer group; a filtered replay
// gets a group per filter, so each filter resumes where it stopped.
const DLQReplayGroupPrefix = "promoflow-dlq-replay"

// DLQReplayConfig is one replay of the dead-letter topic.
type DLQReplayConfig struct {
	// Brokers are the Kafka bootstrap servers.
	Brokers []string
	// DLQTopic defaults to middleware.DLQTopicDefault.
	DLQTopic string
	// ReplayTopic, read by the catalog consumer only, defaults to ReplayTopicDefault.
	ReplayTopic string
	// Group commits the replay's position, so a stopped replay resumes.
	// Defaults to DLQReplayGroupPrefix, with a suffix per filter.
	Group string
	// Reason keeps records whose x-dlq-reason contains it.
	Reason string
	// ErrorCode keeps records whose x-dlq-error-code equals it.
	ErrorCode string
	// ID keeps records whose PurchaseId (aggregate_id) or MessageId equals it.
	ID string
	// DryRun lists what would be replayed and changes nothing.
	DryRun bool
	// Max stops after that many replayed records; 0 means all.
	Max int64
	// Rate caps replayed records per second; 0 means no cap.
	Rate float64
	// ProgressEvery is the time between progress logs. Defaults to 2s.
	ProgressEvery time.Duration
}

func (c *DLQReplayConfig) setDefaults() {
	c.DLQTopic = cmp.Or(c.DLQTopic, middleware.DLQTopicDefault)
	c.ReplayTopic = cmp.Or(c.ReplayTopic, ReplayTopicDefault)
	c.ProgressEvery = cmp.Or(c.ProgressEvery, 2*time.Second)
	if c.Group == "" {
		c.Group = DLQReplayGroupPrefix
		if f := c.Reason + "\x00" + c.ErrorCode + "\x00" + c.ID; f != "\x00\x00" {
			sum := sha1.Sum([]byte(f))
			c.Group += "-" + hex.EncodeToString(sum[:4])
		}
	}
}

// Validate reports every bad setting.
func (c DLQReplayConfig) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("kafka brokers are required"))
	}
	if c.Max < 0 {
		errs = append(errs, errors.New("max must be >= 0"))
	}
	if c.Rate < 0 {
		errs = append(errs, errors.New("rate must be >= 0"))
	}
	if c.DLQTopic == c.ReplayTopic {
		errs = append(errs, errors.New("the replay topic must differ from the DLQ topic"))
	}
	return errors.Join(errs...)
}

func (c DLQReplayConfig) matches(msg *message.Message) bool {
	if c.Reason != "" && !strings.Contains(msg.Metadata.Get(middleware.HeaderDLQReason), c.Reason) {
		return false
	}
	if c.ErrorCode != "" && msg.Metadata.Get(middleware.HeaderDLQErrorCode) != c.ErrorCode {
		return false
	}
	if c.ID != "" && msg.Metadata.Get(event.HeaderAggregateID) != c.ID && msg.UUID != c.ID {
		return false
	}
	return true
}

// DLQReplayResult counts what a replay did.
type DLQReplayResult struct {
	Group     string
	Read      int64
	Matched   int64
	Forwarded int64
}

// ReplayDLQ replays the dead-letter topic to the replay topic with a Watermill
// forwarder, from the group's committed position to the end seen at the start,
// committing as it goes. A dry run reads from the same position and publishes
// and commits nothing.
func ReplayDLQ(ctx context.Context, cfg DLQReplayConfig, log *slog.Logger) (DLQReplayResult, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return DLQReplayResult{}, err
	}
	st := &replayState{cfg: cfg, log: log, res: DLQReplayResult{Group: cfg.Group}}
	todo, err := st.remaining()
	if err != nil {
		return st.result(), err
	}
	log.Info("dlq replay starting", "group", cfg.Group, "dryRun", cfg.DryRun, "records", todo.count())
	if todo.count() == 0 {
		return st.result(), nil
	}
	st.todo = todo

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st.done = cancel
	stopProgress := st.reportProgress(ctx)
	defer stopProgress()

	run := st.forward
	if cfg.DryRun {
		run = st.dryRun
	}
	err = run(ctx)
	return st.result(), err
}

// replayState tracks progress across partitions.
type replayState struct {
	cfg  DLQReplayConfig
	log  *slog.Logger
	todo partitionTodo
	done context.CancelFunc

	read, matched, forwarded atomic.Int64
	mu                       sync.Mutex
	res                      DLQReplayResult
	// acked is, per partition, the offset after the last record acked.
	acked    map[int32]int64
	stopping sync.Once
}

// partitionTodo maps partition → [from, end) still to replay.
type partitionTodo map[int32][2]int64

func (t partitionTodo) count() int64 {
	var n int64
	for _, r := range t {
		n += r[1] - r[0]
	}
	return n
}

func (s *replayState) result() DLQReplayResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.res.Read, s.res.Matched, s.res.Forwarded = s.read.Load(), s.matched.Load(), s.forwarded.Load()
	return s.res
}

// remaining reads the group's committed offsets and the topic's ends.
func (s *replayState) remaining() (partitionTodo, error) {
	client, err := sarama.NewClient(s.cfg.Brokers, ClientConfig("promoflow-dlq-replay"))
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer client.Close()
	ends, err := endOffsets(client, []string{s.cfg.DLQTopic})
	if err != nil {
		return nil, err
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return nil, fmt.Errorf("kafka admin: %w", err)
	}
	parts := map[string][]int32{}
	for _, pe := range ends {
		parts[pe.topic] = append(parts[pe.topic], pe.partition)
	}
	committed, err := admin.ListConsumerGroupOffsets(s.cfg.Group, parts)
	if err != nil {
		return nil, fmt.Errorf("offsets of group %s: %w", s.cfg.Group, err)
	}
	todo := partitionTodo{}
	for _, pe := range ends {
		from := pe.start
		if b := committed.GetBlock(pe.topic, pe.partition); b != nil && b.Offset > from {
			from = b.Offset
		}
		if from < pe.end {
			todo[pe.partition] = [2]int64{from, pe.end}
		}
	}
	return todo, nil
}

// seen records that offset of partition was handled; when every partition
// reached its end, the replay is done.
func (s *replayState) seen(partition int32, offset int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.acked == nil {
		s.acked = map[int32]int64{}
	}
	s.acked[partition] = offset + 1
	if r, ok := s.todo[partition]; ok && offset >= r[1]-1 {
		delete(s.todo, partition)
	}
	if len(s.todo) == 0 {
		go s.stop()
	}
}

// stop ends the replay once the group has committed every acked record, so
// that the next run resumes exactly after them. Kafka commits acks in the
// background; this waits for that (up to 15s) instead of racing it.
func (s *replayState) stop() {
	s.stopping.Do(func() {
		deadline := time.Now().Add(15 * time.Second)
		for !s.committed() && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		s.done()
	})
}

func (s *replayState) committed() bool {
	s.mu.Lock()
	want := make(map[int32]int64, len(s.acked))
	for p, off := range s.acked {
		want[p] = off
	}
	s.mu.Unlock()
	if len(want) == 0 {
		return true
	}
	admin, err := sarama.NewClusterAdmin(s.cfg.Brokers, ClientConfig("promoflow-dlq-replay"))
	if err != nil {
		return false
	}
	defer admin.Close()
	parts := make([]int32, 0, len(want))
	for p := range want {
		parts = append(parts, p)
	}
	got, err := admin.ListConsumerGroupOffsets(s.cfg.Group, map[string][]int32{s.cfg.DLQTopic: parts})
	if err != nil {
		return false
	}
	for p, off := range want {
		if b := got.GetBlock(s.cfg.DLQTopic, p); b == nil || b.Offset < off {
			return false
		}
	}
	return true
}

func (s *replayState) capReached() bool {
	return s.cfg.Max > 0 && s.matched.Load() >= s.cfg.Max
}

func (s *replayState) reportProgress(ctx context.Context) func() {
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(s.cfg.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-stop:
				return
			case <-t.C:
				r := s.result()
				s.log.Info("dlq replay progress", "read", r.Read, "matched", r.Matched, "forwarded", r.Forwarded)
			}
		}
	}()
	return func() { close(stop) }
}

// pace waits for the rate limit.
type pacer struct {
	every time.Duration
	next  time.Time
}

func (p *pacer) wait(ctx context.Context) error {
	if p.every == 0 {
		return nil
	}
	now := time.Now()
	if p.next.After(now) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(p.next.Sub(now)):
		}
		now = p.next
	}
	p.next = now.Add(p.every)
	return nil
}

func newPacer(rate float64) *pacer {
	if rate <= 0 {
		return &pacer{}
	}
	return &pacer{every: time.Duration(float64(time.Second) / rate)}
}

// forward runs the Watermill forwarder: the DLQ subscriber, filtered and
// wrapped into forwarder envelopes for the replay topic, then the Kafka publisher.
func (s *replayState) forward(ctx context.Context) error {
	wlog := watermill.NewSlogLogger(s.log)
	sub, err := NewConsumerGroupSubscriber(s.cfg.Brokers, s.cfg.Group, wlog)
	if err != nil {
		return err
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               s.cfg.Brokers,
		Marshaler:             kafka.NewWithPartitioningMarshaler(middleware.DLQPartitionKey),
		OverwriteSaramaConfig: DurableProducerConfig("promoflow-dlq-replay"),
	}, wlog)
	if err != nil {
		return fmt.Errorf("replay publisher: %w", err)
	}
	defer pub.Close()
	countForwarded := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil {
				s.forwarded.Add(1)
			}
			return out, err
		}
	}
	fwd, err := forwarder.NewForwarder(&dlqSource{inner: sub, state: s, pace: newPacer(s.cfg.Rate)}, pub, wlog,
		forwarder.Config{ForwarderTopic: s.cfg.DLQTopic, Middlewares: []message.HandlerMiddleware{countForwarded}})
	if err != nil {
		return fmt.Errorf("replay forwarder: %w", err)
	}
	err = fwd.Run(ctx)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// dlqSource subscribes to the DLQ and hands the forwarder an envelope per
// matching record. A record that does not match is acked (skipped); nothing is
// acked past the cap, so the next run resumes there.
type dlqSource struct {
	inner message.Subscriber
	state *replayState
	pace  *pacer
}

func (d *dlqSource) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := d.inner.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for msg := range in {
			if !d.handle(ctx, msg, out) {
				return
			}
		}
	}()
	return out, nil
}

func (d *dlqSource) handle(ctx context.Context, msg *message.Message, out chan<- *message.Message) bool {
	s := d.state
	partition, _ := kafka.MessagePartitionFromCtx(msg.Context())
	offset, _ := kafka.MessagePartitionOffsetFromCtx(msg.Context())
	s.read.Add(1)
	if !s.cfg.matches(msg) {
		msg.Ack()
		s.seen(partition, offset)
		return true
	}
	if s.capReached() {
		// Leave this record unacked for the next run, and keep the
		// subscription open until the acked ones are committed.
		go s.stop()
		<-ctx.Done()
		return false
	}
	if err := d.pace.wait(ctx); err != nil {
		return false
	}
	s.matched.Add(1)
	env, err := envelope(s.cfg.ReplayTopic, msg)
	if err != nil {
		s.log.Error("cannot wrap a DLQ record", "MessageId", msg.UUID, "error", err.Error())
		msg.Nack()
		return false
	}
	select {
	case out <- env:
	case <-ctx.Done():
		return false
	}
	select {
	case <-env.Acked():
		msg.Ack()
		s.seen(partition, offset)
		if s.capReached() {
			go s.stop()
		}
	case <-env.Nacked():
		s.matched.Add(-1)
		msg.Nack()
	case <-ctx.Done():
		return false
	}
	return true
}

func (d *dlqSource) Close() error { return d.inner.Close() }

// envelope wraps msg for destination the way forwarder.Publisher does, by
// letting one publish into a capture.
func envelope(destination string, msg *message.Message) (*message.Message, error) {
	var c capture
	clean := message.NewMessage(msg.UUID, msg.Payload)
	for k, v := range msg.Metadata {
		clean.Metadata.Set(k, v)
	}
	if err := forwarder.NewPublisher(&c, forwarder.PublisherConfig{}).Publish(destination, clean); err != nil {
		return nil, err
	}
	return c.msg, nil
}

type capture struct{ msg *message.Message }

func (c *capture) Publish(_ string, msgs ...*message.Message) error {
	c.msg = msgs[0]
	return nil
}

func (c *capture) Close() error { return nil }

// dryRun reads the same records with plain partition consumers and logs each
// that would be replayed.
func (s *replayState) dryRun(ctx context.Context) error {
	consumer, err := sarama.NewConsumer(s.cfg.Brokers, ClientConfig("promoflow-dlq-replay"))
	if err != nil {
		return fmt.Errorf("kafka consumer: %w", err)
	}
	defer consumer.Close()
	s.mu.Lock()
	todo := make(partitionTodo, len(s.todo))
	for p, r := range s.todo {
		todo[p] = r
	}
	s.mu.Unlock()
	for p, r := range todo {
		pc, err := consumer.ConsumePartition(s.cfg.DLQTopic, p, r[0])
		if err != nil {
			return fmt.Errorf("consume %s/%d: %w", s.cfg.DLQTopic, p, err)
		}
		for off := r[0]; off < r[1] && !s.capReached(); {
			var cm *sarama.ConsumerMessage
			select {
			case <-ctx.Done():
				pc.Close()
				return nil
			case cm = <-pc.Messages():
			}
			off = cm.Offset + 1
			msg, err := kafka.DefaultMarshaler{}.Unmarshal(cm)
			if err != nil {
				pc.Close()
				return err
			}
			s.read.Add(1)
			if !s.cfg.matches(msg) {
				continue
			}
			s.matched.Add(1)
			s.log.Info("would replay", "partition", p, "offset", cm.Offset, "MessageId", msg.UUID,
				"PurchaseId", msg.Metadata.Get(event.HeaderAggregateID),
				"code", msg.Metadata.Get(middleware.HeaderDLQErrorCode), "reason", msg.Metadata.Get(middleware.HeaderDLQReason))
		}
		pc.Close()
	}
	return nil
}
