package router

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// tickSource is the ticker-fed publisher: it publishes a tick at once and then
// every interval. Its GoChannel blocks Publish until the handler acks, so a tick
// never starts while the previous cycle runs; ticks due meanwhile are dropped.
type tickSource struct {
	pubsub *gochannel.GoChannel
	topic  string
	every  time.Duration
	// early, when set, brings a tick forward between the interval's ticks.
	// The same loop publishes it, so it never overlaps a cycle either.
	early earlyTicks
}

// earlyTicks runs beside a tick source and signals on C when a tick is due
// before the interval is up (expire.Wakeup).
type earlyTicks interface {
	Run(ctx context.Context)
	C() <-chan struct{}
}

func newTickSource(topic string, every time.Duration, logger watermill.LoggerAdapter) *tickSource {
	return &tickSource{
		pubsub: gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger),
		topic:  topic,
		every:  every,
	}
}

func (s *tickSource) run(ctx context.Context) {
	var early <-chan struct{} // nil without early ticks: never ready
	if s.early != nil {
		early = s.early.C()
		done := make(chan struct{})
		go func() { defer close(done); s.early.Run(ctx) }()
		defer func() { <-done }()
	}
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		_ = s.pubsub.Publish(s.topic, message.NewMessage(watermill.NewUUID(), nil))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-early:
		}
	}
}
