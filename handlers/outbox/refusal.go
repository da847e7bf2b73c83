package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/lib/pq"

	"github.com/promoflow/promoflow/handlers/dberr"
)

// How the relay lives through a database that takes no writes (a standby at
// the primary's address, a read-only server): its subscriber's queries, each
// in a READ WRITE transaction, fail every RetryInterval until the server
// takes writes again. Each failure is counted by its reason
// (dberr.Reason), a read-only spell is logged once when it starts and once
// when it ends (dberr.Watch), and a relay that starts on such a server waits
// for it instead of ending the process.

// QueryBackoff is the relay subscriber's wmsql.BackoffManager.
type QueryBackoff struct {
	// PollInterval is the wait after a query that found nothing. Defaults to 1s.
	PollInterval time.Duration
	// RetryInterval is the wait after a failed query. Defaults to 1s.
	RetryInterval time.Duration
	// InRecovery tells a standby's 0A000 from a fault. Required.
	InRecovery dberr.Recovery
	// OnError is told the reason of each failed query, for a metric.
	OnError func(reason string)
	// ReadOnly follows the read-only spells; other failures are logged at
	// each attempt, as watermill-sql does.
	ReadOnly *dberr.Watch
}

// retryIntervalDefault is watermill-sql's own wait after a failed query
// and after an empty poll.
const retryIntervalDefault = time.Second

// HandleError implements wmsql.BackoffManager.
func (b QueryBackoff) HandleError(logger watermill.LoggerAdapter, noMsg bool, err error) time.Duration {
	if err == nil {
		b.ReadOnly.Observe(nil)
		if noMsg {
			return cmp.Or(b.PollInterval, retryIntervalDefault)
		}
		return 0
	}
	wait := cmp.Or(b.RetryInterval, retryIntervalDefault)
	if errors.Is(err, sql.ErrTxDone) {
		// The page's transaction was rolled back on purpose, so that its
		// ack fails: its position session was lost (PositionGuard), or its
		// Kafka transaction did not commit (PageTransaction). No database
		// fault: not counted as one, and the page is read again.
		logger.Info("relay page rolled back unacknowledged; it is read again", watermill.LogFields{"wait_time": wait})
		return wait
	}
	err = dberr.Classify(context.Background(), err, b.InRecovery)
	if retryNow(err) {
		logger.Debug("relay query lost a lock race, trying again", watermill.LogFields{"err": err.Error()})
		return 0
	}
	reason := dberr.Reason(err)
	if b.OnError != nil {
		b.OnError(reason)
	}
	if reason == dberr.ReasonReadOnly {
		b.ReadOnly.Observe(err)
		return wait
	}
	logger.Error("Error querying for message", err, watermill.LogFields{"wait_time": wait})
	return wait
}

// retryNow reports a deadlock or a serialization failure, which watermill-sql
// retries at once.
func retryNow(err error) bool {
	var pqErr *pq.Error
	return errors.As(err, &pqErr) && (pqErr.Code == "40P01" || pqErr.Code == "40001")
}

var _ wmsql.BackoffManager = QueryBackoff{}

// PatientSubscriber is a subscriber whose Subscribe outlasts a database that
// takes no writes or cannot serve yet: watermill-sql's Subscribe writes the
// consumer group's offsets row in a READ WRITE transaction, and its error
// would end the router, the API and the expirer with it. While the refusal
// lasts it retries each Retry, and its channel carries the messages once
// the subscription is made.
type PatientSubscriber struct {
	message.Subscriber
	// InRecovery tells a standby's 0A000 from a fault. Required.
	InRecovery dberr.Recovery
	// Retry is the wait between attempts. Defaults to 1s.
	Retry time.Duration
	// ReadOnly follows the read-only spell, as QueryBackoff's does.
	ReadOnly *dberr.Watch
	// OnError is told the reason of each failed attempt, for a metric.
	OnError func(reason string)
}

// Subscribe subscribes at once when it can; otherwise, on a read-only or
// unavailable database, it returns a channel that a background attempt
// feeds once the subscription is made. Any other error is returned.
func (s PatientSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	in, err := s.Subscriber.Subscribe(ctx, topic)
	if err == nil || !s.transient(ctx, err) {
		return in, err
	}
	retry := cmp.Or(s.Retry, retryIntervalDefault)
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for in == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
			// Past the first attempt every failure is retried: the
			// process serves on, and OnError's metric shows it.
			in, err = s.Subscriber.Subscribe(ctx, topic)
			if err != nil {
				s.transient(ctx, err)
			}
		}
		s.ReadOnly.Observe(nil)
		for msg := range in {
			select {
			case out <- msg:
			case <-ctx.Done():
				msg.Nack()
				return
			}
		}
	}()
	return out, nil
}

// transient reports a refusal that waiting may end; it counts err and
// records a read-only one.
func (s PatientSubscriber) transient(ctx context.Context, err error) bool {
	err = dberr.Classify(ctx, err, s.InRecovery)
	if s.OnError != nil {
		s.OnError(dberr.Reason(err))
	}
	if dberr.ReadOnly(err) {
		s.ReadOnly.Observe(err)
		return true
	}
	return dberr.Unavailable(err)
}
