package middleware

import (
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Lag measures consumer lag as the age of records: the oldest one in flight
// (so lag grows while a record waits on infrastructure retries), or the last
// one finished if that was less than recentWindow ago (so a steady backlog
// shows between records). An idle consumer has no lag. Its Middleware goes
// outermost in the chain, so that a record counts from arrival to ack.
type Lag struct {
	mu       sync.Mutex
	inflight map[*message.Message]time.Time
	lastLag  time.Duration
	lastDone time.Time
	now      func() time.Time
	// stamp is a record's Kafka timestamp.
	stamp func(*message.Message) (time.Time, bool)
}

const recentWindow = 5 * time.Second

// NewLag returns a Lag reading Kafka record timestamps.
func NewLag() *Lag {
	return &Lag{inflight: map[*message.Message]time.Time{}, now: time.Now,
		stamp: func(msg *message.Message) (time.Time, bool) { return kafka.MessageTimestampFromCtx(msg.Context()) }}
}

// Middleware tracks each record from arrival to ack.
func (l *Lag) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ts, ok := l.stamp(msg)
		if !ok {
			return h(msg)
		}
		l.mu.Lock()
		l.inflight[msg] = ts
		l.mu.Unlock()
		defer func() {
			l.mu.Lock()
			delete(l.inflight, msg)
			l.lastDone = l.now()
			l.lastLag = l.lastDone.Sub(ts)
			l.mu.Unlock()
		}()
		return h(msg)
	}
}

// Seconds is the current lag (catalog_promotion_lag_seconds).
func (l *Lag) Seconds() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	var lag time.Duration
	if now.Sub(l.lastDone) < recentWindow {
		lag = l.lastLag
	}
	for _, ts := range l.inflight {
		lag = max(lag, now.Sub(ts))
	}
	return max(lag, 0).Seconds()
}
