package outbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// flakyPublisher fails while broken is set.
type flakyPublisher struct{ broken atomic.Bool }

var errBroken = errors.New("kafka does not answer")

func (p *flakyPublisher) Publish(string, ...*message.Message) error {
	if p.broken.Load() {
		return errBroken
	}
	return nil
}
func (p *flakyPublisher) Close() error { return nil }

// changes records what a StepBack tells OnChange.
type changes struct {
	mu     sync.Mutex
	pauses []time.Duration // one per step back
	comes  int
}

func (c *changes) record(back bool, cause error, pause time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if back {
		c.pauses = append(c.pauses, pause)
	} else {
		c.comes++
	}
}

func (c *changes) get() ([]time.Duration, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.pauses...), c.comes
}

// TestStepBack_AFailedPublishHoldsTheRelayBackUntilKafkaAnswers: after a
// failed publish the relay stands back: its handler publishes nothing and
// only nacks once the message's context ends, and it stays back while the
// probe fails, however many pauses pass. Once the probe answers it comes
// back; a failure in a row doubles the pause, a success resets it.
func TestStepBack_AFailedPublishHoldsTheRelayBackUntilKafkaAnswers(t *testing.T) {
	t.Parallel()
	var answers atomic.Bool
	var probes atomic.Int64
	seen := &changes{}
	s, err := outbox.NewStepBack(outbox.StepBackConfig{Pause: 10 * time.Millisecond, MaxPause: 40 * time.Millisecond,
		OnChange: seen.record,
		Probe: func(context.Context) error {
			probes.Add(1)
			if answers.Load() {
				return nil
			}
			return errBroken
		}})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	pub := &flakyPublisher{}
	relay := s.Publisher(pub)
	require.False(t, s.Back())
	require.NoError(t, relay.Publish("t", message.NewMessage("1", nil)))

	pub.broken.Store(true)
	require.ErrorIs(t, relay.Publish("t", message.NewMessage("2", nil)), errBroken)
	require.True(t, s.Back(), "a failed publish steps the relay back")

	called := false
	handler := s.Middleware(func(*message.Message) ([]*message.Message, error) { called = true; return nil, nil })
	msg := message.NewMessage("3", nil)
	ctx, cancel := context.WithCancel(context.Background())
	msg.SetContext(ctx)
	done := make(chan error, 1)
	go func() { _, err := handler(msg); done <- err }()
	cancel() // the subscriber's ack deadline
	require.ErrorIs(t, <-done, outbox.ErrSteppedBack)
	require.False(t, called, "nothing is published while the relay stands back")

	require.Eventually(t, func() bool { return probes.Load() >= 3 }, 10*time.Second, 5*time.Millisecond)
	require.True(t, s.Back(), "the relay stays back while Kafka does not answer")
	answers.Store(true)
	require.Eventually(t, func() bool { return !s.Back() }, 10*time.Second, 5*time.Millisecond, "it comes back once Kafka answers")

	require.ErrorIs(t, relay.Publish("t", message.NewMessage("4", nil)), errBroken)
	require.Eventually(t, func() bool { return !s.Back() }, 10*time.Second, 5*time.Millisecond)
	pub.broken.Store(false)
	require.NoError(t, relay.Publish("t", message.NewMessage("5", nil)))
	pub.broken.Store(true)
	require.ErrorIs(t, relay.Publish("t", message.NewMessage("6", nil)), errBroken)
	pauses, comes := seen.get()
	require.Equal(t, []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 10 * time.Millisecond}, pauses,
		"the pause doubles with failures in a row and resets after a success")
	require.Equal(t, 2, comes)
}

// TestStepBack_NoPublishStartsCloserToTheAckDeadlineThanItMayTake: a
// message whose context ends sooner than a publish may take is nacked
// without a publish (one that then succeeded after the subscriber gave the
// page up would be published again by the next holder); one with time
// left is handled.
func TestStepBack_NoPublishStartsCloserToTheAckDeadlineThanItMayTake(t *testing.T) {
	t.Parallel()
	s, err := outbox.NewStepBack(outbox.StepBackConfig{PublishTimeout: time.Hour})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	var calls atomic.Int64
	handler := s.Middleware(func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, nil })

	roomy := message.NewMessage("roomy", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	roomy.SetContext(ctx)
	_, err = handler(roomy)
	require.NoError(t, err)
	require.EqualValues(t, 1, calls.Load())

	tight := message.NewMessage("tight", nil)
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Minute)
	tight.SetContext(ctx)
	done := make(chan error, 1)
	go func() { _, err := handler(tight); done <- err }()
	cancel()
	require.ErrorIs(t, <-done, outbox.ErrNoTimeToPublish)
	require.EqualValues(t, 1, calls.Load(), "no publish starts that could outlast the ack deadline")
}

// TestRelaySchema_StandingBackReadsNothingAndLocksNothing: while the relay
// stands back its poll reads no row and leaves the position's row free for
// another process to lock.
func TestRelaySchema_StandingBackReadsNothingAndLocksNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	db.MustExec(`INSERT INTO `+outbox.OffsetsTable+` (consumer_group, offset_acked, last_processed_transaction_id)
		VALUES ($1, 0, '0') ON CONFLICT DO NOTHING`, outbox.RelayConsumerGroup)
	tx, err := outbox.BeginTx(t.Context(), db, nil)
	require.NoError(t, err)
	msg := message.NewMessage("u-1", []byte(`{}`))
	msg.Metadata.Set("aggregate_id", "a-1")
	require.NoError(t, outbox.PublishTx(tx, "topic", msg))
	require.NoError(t, tx.Commit())
	var back atomic.Bool
	schema := outbox.RelaySchema(10, back.Load, 0, 0)
	read := func() (rows int) {
		tx := db.MustBegin()
		defer func() { require.NoError(t, tx.Rollback()) }()
		q := schema.SelectQuery(outbox.ForwarderTopic, outbox.RelayConsumerGroup, outbox.Offsets())
		res, err := tx.Query(q.Query, q.Args...)
		require.NoError(t, err)
		for res.Next() {
			rows++
		}
		require.NoError(t, res.Err())
		// Another process tries the position while this poll's transaction is open.
		other := db.MustBegin()
		defer func() { require.NoError(t, other.Rollback()) }()
		var group string
		err = other.Get(&group, `SELECT consumer_group FROM `+outbox.OffsetsTable+` WHERE consumer_group = $1 FOR UPDATE NOWAIT`,
			outbox.RelayConsumerGroup)
		if back.Load() {
			require.NoError(t, err, "the position is free while the relay stands back")
		} else {
			require.Error(t, err, "a relay that reads holds the position")
		}
		return rows
	}
	// A poll reads nothing past a transaction of the server that ended after
	// its snapshot was taken (it may have been an outbox writer): another
	// test's, in another database, can make one poll read nothing.
	require.Eventually(t, func() bool { return read() == 1 }, 10*time.Second, 10*time.Millisecond,
		"a relay that does not stand back reads the committed row")
	back.Store(true)
	require.Zero(t, read())
}
