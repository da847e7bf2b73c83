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
}

func newTickSource(topic string, every time.Duration, logger watermill.LoggerAdapter) *tickSource {
	return &tickSource{
		pubsub: gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger),
		topic:  topic,
		every:  every,
	}
}

func (s *tickSource) run(ctx context.Context) {
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		_ = s.pubsub.Publish(s.topic, message.NewMessage(watermill.NewUUID(), nil))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
