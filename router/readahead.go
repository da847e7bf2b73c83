package router

import (
	"cmp"
	"slices"
	"sync"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
)

// recordOverhead is what the consumer holds for a fetched record beside its
// key, value and headers: Sarama's ConsumerMessage and its header slice.
// Counted per record, so that a batch of small records weighs what it
// costs.
const recordOverhead = 1024

// readAhead bounds the bytes a consumer has fetched but not yet handled,
// over all of its partitions. Sarama queues each partition's records in a
// channel, which here is deep (ConsumerBuffers.ReadAhead), so that a fetch
// that returns one partition's large record batch is queued at once and the
// next fetch serves another partition: the handler then sees many partitions
// at a time, which is what the group commit batches. Counting records by
// their count alone would let 4,096 records of 1 KiB each queue on every
// partition; counted in bytes, the read-ahead stops at its budget.
//
// It is a Sarama consumer interceptor: OnConsume runs as Sarama hands a
// fetched record to its partition's channel, and waits there while the
// records fetched and not handled weigh more than the budget. Sarama sends
// the next fetch to a broker once every partition of the last one has
// queued its records, so a wait stops the fetching too. The first record is
// never held, so a record larger than the budget still passes.
//
// A wait ends with the consumer-group session it belongs to: a rebalance
// or a close must not find a partition consumer held here. Between
// sessions nothing is counted; a session starts from zero.
type readAhead struct {
	budget int64
	// gauge (may be nil) is added what is counted and taken what is
	// released, so that consumers sharing it sum.
	gauge prometheus.Gauge

	mu      sync.Mutex
	changed *sync.Cond
	used    int64
	pending map[claimKey][]fetched
	// top is the highest offset of each partition counted in this session:
	// a record Sarama hands over again (its interceptor runs once per
	// delivery) is not counted again, since its handler's return releases
	// it once.
	top map[claimKey]int64
	// session is the running session's number, 0 between sessions.
	session, last uint64
}

// claimKey is one partition of one topic.
type claimKey struct {
	topic     string
	partition int32
}

type fetched struct {
	offset int64
	bytes  int64
}

func newReadAhead(budget int64, gauge prometheus.Gauge) *readAhead {
	r := &readAhead{budget: budget, gauge: gauge, pending: map[claimKey][]fetched{}, top: map[claimKey]int64{}}
	r.changed = sync.NewCond(&r.mu)
	return r
}

// recordBytes is what a record is counted as.
func recordBytes(msg *sarama.ConsumerMessage) int64 {
	n := int64(len(msg.Key) + len(msg.Value) + recordOverhead)
	for _, h := range msg.Headers {
		n += int64(len(h.Key) + len(h.Value))
	}
	return n
}

// OnConsume counts msg, once the records before it leave room for it, and
// detaches it from the fetch response it was decoded from.
func (r *readAhead) OnConsume(msg *sarama.ConsumerMessage) {
	detach(msg)
	n := recordBytes(msg)
	k := claimKey{msg.Topic, msg.Partition}
	r.mu.Lock()
	defer r.mu.Unlock()
	if top, ok := r.top[k]; ok && msg.Offset <= top {
		return // delivered again: counted already
	}
	session := r.session
	for session != 0 && r.session == session && r.used > 0 && r.used+n > r.budget {
		r.changed.Wait()
	}
	if session == 0 || r.session != session {
		return
	}
	r.pending[k] = append(r.pending[k], fetched{msg.Offset, n})
	r.top[k] = msg.Offset
	r.add(n)
}

// detach copies msg's key, value and headers out of the buffer Sarama
// decoded them in place from (the fetch response, or a compressed batch's
// decompressed copy), into one allocation of the record's own. Otherwise
// one record waiting keeps that whole buffer, up to a fetch response, from
// being freed; with lanes, whose partitions move on at their own pace, the
// buffers kept that way came to more than the read-ahead counts. Detached,
// what is held is what is counted.
func detach(msg *sarama.ConsumerMessage) {
	size := len(msg.Key) + len(msg.Value)
	for _, h := range msg.Headers {
		size += len(h.Key) + len(h.Value)
	}
	buf := make([]byte, 0, size)
	own := func(b []byte) []byte {
		if len(b) == 0 {
			return b
		}
		start := len(buf)
		buf = append(buf, b...)
		return buf[start:len(buf):len(buf)]
	}
	msg.Key, msg.Value = own(msg.Key), own(msg.Value)
	for _, h := range msg.Headers {
		h.Key, h.Value = own(h.Key), own(h.Value)
	}
}

// add counts n more bytes (less, when negative); r.mu is held.
func (r *readAhead) add(n int64) {
	r.used += n
	if r.gauge != nil {
		r.gauge.Add(float64(n))
	}
}

// handled releases the record of topic's partition at offset. With lanes
// the records of a partition are handled out of order, so a record is
// released alone, and the queue's head of released records is dropped.
func (r *readAhead) handled(topic string, partition int32, offset int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := claimKey{topic, partition}
	q := r.pending[k]
	i, found := slices.BinarySearchFunc(q, offset, func(f fetched, o int64) int { return cmp.Compare(f.offset, o) })
	if !found || q[i].bytes < 0 {
		return
	}
	r.add(-q[i].bytes)
	q[i].bytes = released
	head := 0
	for head < len(q) && q[head].bytes == released {
		head++
	}
	if head == len(q) {
		delete(r.pending, k)
	} else {
		r.pending[k] = q[head:]
	}
	r.changed.Broadcast()
}

// released marks a record of a partition's queue that was handled while
// one before it was not.
const released = -1

// start begins counting for a new session and returns its number.
func (r *readAhead) start() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last++
	r.session = r.last
	r.reset()
	return r.session
}

// end stops counting for session and frees whatever waits in it; a later
// session's end is not this one's.
func (r *readAhead) end(session uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.session == session {
		r.session = 0
		r.reset()
	}
}

func (r *readAhead) reset() {
	r.add(-r.used)
	clear(r.pending)
	clear(r.top)
	r.changed.Broadcast()
}

// inUse is what is counted now, for tests and the gauge.
func (r *readAhead) inUse() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.used
}

// Middleware releases each message's record once the handler returns,
// whatever it returned: a record the handler holds (a retry) or nacks is no
// longer queued. It goes outermost, before anything can hold a message.
func (r *readAhead) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		defer func() {
			p, okP := kafka.MessagePartitionFromCtx(msg.Context())
			o, okO := kafka.MessagePartitionOffsetFromCtx(msg.Context())
			if topic := message.SubscribeTopicFromCtx(msg.Context()); okP && okO && topic != "" {
				r.handled(topic, p, o)
			}
		}()
		return h(msg)
	}
}

// Tracer wraps next so that each consumer-group session starts and ends
// the count; next's other wraps stay.
func (r *readAhead) Tracer(next kafka.SaramaTracer) kafka.SaramaTracer {
	return readAheadTracer{SaramaTracer: next, r: r}
}

type readAheadTracer struct {
	kafka.SaramaTracer
	r *readAhead
}

func (t readAheadTracer) WrapConsumerGroupHandler(h sarama.ConsumerGroupHandler) sarama.ConsumerGroupHandler {
	return readAheadHandler{ConsumerGroupHandler: t.SaramaTracer.WrapConsumerGroupHandler(h), r: t.r}
}

type readAheadHandler struct {
	sarama.ConsumerGroupHandler
	r *readAhead
}

func (h readAheadHandler) Setup(sess sarama.ConsumerGroupSession) error {
	session := h.r.start()
	go func() {
		<-sess.Context().Done()
		h.r.end(session)
	}()
	return h.ConsumerGroupHandler.Setup(sess)
}
