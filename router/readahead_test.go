package router

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// record is a fetched record of 1,000 bytes and recordOverhead.
func record(partition int32, offset int64) *sarama.ConsumerMessage {
	return &sarama.ConsumerMessage{Topic: "t", Partition: partition, Offset: offset, Key: make([]byte, 36), Value: make([]byte, 964)}
}

const recordSize = 1000 + recordOverhead

// consumed runs OnConsume for msg and closes its result once it returns.
func consumed(r *readAhead, msg *sarama.ConsumerMessage) <-chan struct{} {
	done := make(chan struct{})
	go func() { defer close(done); r.OnConsume(msg) }()
	return done
}

func returned(c <-chan struct{}) func() bool {
	return func() bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
}

// TestReadAhead_WaitsPastItsBudgetUntilRecordsAreHandled: records of every
// partition count against one budget; the record that would pass it waits
// until the handler is done with an earlier one, of whichever partition.
func TestReadAhead_WaitsPastItsBudgetUntilRecordsAreHandled(t *testing.T) {
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	r := newReadAhead(2*recordSize, gauge)
	r.start()
	r.OnConsume(record(0, 10))
	r.OnConsume(record(1, 20))
	require.EqualValues(t, 2*recordSize, r.inUse())
	third := consumed(r, record(0, 11))
	require.Never(t, returned(third), 50*time.Millisecond, time.Millisecond, "a record past the budget was let through")

	r.handled("t", 1, 20)
	require.Eventually(t, returned(third), 5*time.Second, time.Millisecond, "handling a record of another partition made no room")
	require.EqualValues(t, 2*recordSize, r.inUse())
	require.EqualValues(t, 2*recordSize, testutil.ToFloat64(gauge))

	// Lanes hand a partition's records out of order: a later record's
	// return releases it alone, not the one before it, still in a lane.
	r.handled("t", 0, 11)
	require.EqualValues(t, recordSize, r.inUse())
	r.handled("t", 0, 11) // a redelivery's second return releases nothing
	require.EqualValues(t, recordSize, r.inUse())
	r.handled("t", 0, 10)
	require.Zero(t, r.inUse())
	require.Zero(t, testutil.ToFloat64(gauge))
	r.handled("t", 0, 10)
	require.Zero(t, r.inUse())
}

// TestReadAhead_ARecordLargerThanTheBudgetPassesAlone: nothing is held
// while nothing is counted, so a record larger than the budget passes, and
// the next one waits for it.
func TestReadAhead_ARecordLargerThanTheBudgetPassesAlone(t *testing.T) {
	r := newReadAhead(100, nil)
	r.start()
	big := &sarama.ConsumerMessage{Topic: "t", Value: make([]byte, 1<<20)}
	require.Eventually(t, returned(consumed(r, big)), 5*time.Second, time.Millisecond, "a record larger than the budget waits forever")
	next := consumed(r, record(0, 1))
	require.Never(t, returned(next), 50*time.Millisecond, time.Millisecond)
	r.handled("t", 0, 0)
	require.Eventually(t, returned(next), 5*time.Second, time.Millisecond)
}

// TestReadAhead_ASessionsEndFreesWhatWaitsAndTheNextStartsFromZero: a
// rebalance or a close ends the session while records wait for the budget;
// the records its claims left unhandled are never released by a handler, so
// the end must free the waits and drop the count. Between sessions nothing
// is counted, and a late end of an old session does not end the next.
func TestReadAhead_ASessionsEndFreesWhatWaitsAndTheNextStartsFromZero(t *testing.T) {
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	r := newReadAhead(recordSize, gauge)
	first := r.start()
	r.OnConsume(record(0, 1))
	waiting := consumed(r, record(0, 2))
	require.Never(t, returned(waiting), 50*time.Millisecond, time.Millisecond)

	r.end(first)
	require.Eventually(t, returned(waiting), 5*time.Second, time.Millisecond, "the session's end left a record waiting")
	require.Zero(t, r.inUse())
	require.Zero(t, testutil.ToFloat64(gauge))
	r.OnConsume(record(0, 3)) // between sessions
	require.Zero(t, r.inUse())

	second := r.start()
	r.OnConsume(record(0, 4))
	r.end(first)
	require.EqualValues(t, recordSize, r.inUse(), "an old session's end reset the new one")
	r.end(second)
	require.Zero(t, r.inUse())
}

// TestReadAhead_ARecordNoLongerPointsIntoItsFetchResponse: Sarama decodes
// a record's key, value and headers in place, inside the fetch response;
// once counted, the record holds copies of its own, so that a record that
// waits does not keep the whole response, which the count does not see.
func TestReadAhead_ARecordNoLongerPointsIntoItsFetchResponse(t *testing.T) {
	response := []byte("key-1value-1hk-1hv-1")
	msg := &sarama.ConsumerMessage{Topic: "t", Key: response[0:5], Value: response[5:12],
		Headers: []*sarama.RecordHeader{{Key: response[12:16], Value: response[16:20]}}}
	r := newReadAhead(1<<20, nil)
	r.start()
	r.OnConsume(msg)
	clear(response)
	require.Equal(t, "key-1", string(msg.Key))
	require.Equal(t, "value-1", string(msg.Value))
	require.Equal(t, "hk-1", string(msg.Headers[0].Key))
	require.Equal(t, "hv-1", string(msg.Headers[0].Value))
	require.Equal(t, len(msg.Key), cap(msg.Key), "an append to the key would write into the value")
	empty := &sarama.ConsumerMessage{Topic: "t", Offset: 1}
	r.OnConsume(empty)
	require.Nil(t, empty.Key, "a record without a key keeps none")
}

// TestReadAhead_RedeliveredRecordIsCountedOnce: Sarama runs the interceptor
// once per delivery, and may hand a record over again; its handler's return
// releases it once, so it is counted once, whether the first delivery is
// still queued or already handled.
func TestReadAhead_RedeliveredRecordIsCountedOnce(t *testing.T) {
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	r := newReadAhead(10*recordSize, gauge)
	r.start()
	r.OnConsume(record(0, 10))
	r.OnConsume(record(0, 10))
	require.EqualValues(t, recordSize, r.inUse(), "a record delivered twice is counted twice")
	r.handled("t", 0, 10)
	r.handled("t", 0, 10)
	require.Zero(t, r.inUse(), "the bytes of a record delivered twice leak")

	r.OnConsume(record(0, 10)) // again, after its handling
	require.Zero(t, r.inUse(), "a record delivered again after its handling is counted again")
	r.OnConsume(record(0, 11))
	r.handled("t", 0, 11)
	require.Zero(t, r.inUse())
	require.Zero(t, testutil.ToFloat64(gauge))

	// A new session (a rebalance, a seek) counts the partition afresh.
	r.start()
	r.OnConsume(record(0, 10))
	require.EqualValues(t, recordSize, r.inUse())
}
