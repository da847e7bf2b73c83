package router

import (
	"hash/maphash"
	"slices"
	"sync"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/promoflow/promoflow/middleware"
)

// LanesDefault is how many records of one partition the consumer hands on
// at once (ConsumerBuffers.Lanes).
const LanesDefault = 8

// InFlightDefault is ConsumerBuffers.InFlight when not set: two
// transactions of 64, the group commit's defaults.
const InFlightDefault = 128

// maxLanes bounds ConsumerBuffers.Lanes: each lane is a goroutine per
// partition claimed.
const maxLanes = 256

// lanes hands the records of one partition to the handler through n lanes
// at once, where watermill-kafka hands one record of a partition at a time
// and waits for its ack. A partition whose records come a large batch at a
// time then gives the group commit n events, not one, so that a topic
// written in 1 MiB record batches, of which a fetch returns few partitions,
// is applied in batches as wide as one written in small ones.
//
// A record's lane is its key's (the purchase id): the records of one
// purchase keep their order, one after the other in one lane, while other
// purchases of the partition go beside them. The partition's offset moves
// in order only: a record is marked consumed once it and every record
// before it in the partition were acked, so a crash or a rebalance
// redelivers every record not yet applied (the unit of work's dedup drops
// those that were).
//
// Each lane is watermill-kafka's own ConsumeClaim over the records sent to
// it, so acks, nacks and their resends behave as they do without lanes.
//
// Over every partition of the subscriber at most slots records are out at
// once, handed to a lane and not yet acked: as many as the group commit
// applies at a time keep it busy, and more only wait in memory, each with
// its goroutines.
type lanes struct {
	next  sarama.ConsumerGroupHandler
	n     int
	slots chan struct{}
	// offsets, when set, learns each claimed partition's order (its Run),
	// by which the unit of work stores offsets that pass only committed
	// records.
	offsets *middleware.Offsets
}

// laneTracer puts lanes innermost, around watermill-kafka's handler, below
// the wraps of next (the claims record, the read-ahead), and the seek to
// the stored offsets outermost.
type laneTracer struct {
	kafka.SaramaTracer
	n, inFlight int
	offsets     *middleware.Offsets
}

func (t laneTracer) WrapConsumerGroupHandler(h sarama.ConsumerGroupHandler) sarama.ConsumerGroupHandler {
	// With offsets stored, a single lane too: its order is what they follow.
	if t.n > 1 || t.offsets != nil {
		h = lanes{next: h, n: t.n, slots: make(chan struct{}, t.inFlight), offsets: t.offsets}
	}
	h = t.SaramaTracer.WrapConsumerGroupHandler(h)
	if t.offsets != nil {
		h = t.offsets.Seeker(h)
	}
	return h
}

func (l lanes) Setup(sess sarama.ConsumerGroupSession) error   { return l.next.Setup(sess) }
func (l lanes) Cleanup(sess sarama.ConsumerGroupSession) error { return l.next.Cleanup(sess) }

// laneQueue is how many records a lane may hold beside the one in hand, so
// that one slow record does not stop the records of other lanes behind it.
// They stay counted by the read-ahead until handled.
const laneQueue = 64

var laneSeed = maphash.MakeSeed()

// laneOf is the lane of a record: its key's, or the first lane for a
// record without a key.
func laneOf(key []byte, n int) int {
	if len(key) == 0 {
		return 0
	}
	return int(maphash.Bytes(laneSeed, key) % uint64(n))
}

// ConsumeClaim feeds the claim's records to n lanes and returns once every
// lane returned: when the claim ends (a rebalance, a close) or a lane fails.
func (l lanes) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	order := &inOrder{sess: sess, slots: l.slots}
	marking := markInOrder{ConsumerGroupSession: sess, order: order}
	// ended closes when the offsets say the database lost commits: the
	// claim ends, and with it the session, whose successor seeks to what
	// the database holds.
	ended := make(chan struct{})
	if l.offsets != nil {
		var once sync.Once
		release := l.offsets.Claim(claim.Topic(), claim.Partition(), order, func() { once.Do(func() { close(ended) }) })
		defer func() { release(order.lastMarked()) }()
	}
	feeds := make([]chan *sarama.ConsumerMessage, l.n)
	errs := make([]error, l.n)
	stopped := make(chan struct{}) // closed when the first lane returns
	var once sync.Once
	var wg sync.WaitGroup
	for i := range feeds {
		feeds[i] = make(chan *sarama.ConsumerMessage, laneQueue)
		wg.Go(func() {
			errs[i] = l.next.ConsumeClaim(marking, laneClaim{ConsumerGroupClaim: claim, records: feeds[i]})
			once.Do(func() { close(stopped) })
		})
	}
	func() {
		defer func() {
			for _, f := range feeds {
				close(f)
			}
		}()
		for {
			var msg *sarama.ConsumerMessage
			select {
			case m, ok := <-claim.Messages():
				if !ok {
					return
				}
				msg = m
			case <-ended:
				return
			}
			lane := laneOf(msg.Key, l.n)
			if !order.fetched(msg, lane) {
				select {
				case l.slots <- struct{}{}:
				case <-stopped:
					return
				case <-sess.Context().Done():
					return
				}
				order.opened(msg, lane)
			}
			select {
			case feeds[lane] <- msg:
			case <-stopped:
				return
			case <-sess.Context().Done():
				return
			}
		}
	}()
	wg.Wait()
	// The lanes left with records unacked give their slots back.
	for range order.open() {
		<-l.slots
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// laneClaim is the claim as one lane sees it: the records sent to it.
type laneClaim struct {
	sarama.ConsumerGroupClaim
	records chan *sarama.ConsumerMessage
}

func (c laneClaim) Messages() <-chan *sarama.ConsumerMessage { return c.records }

// markInOrder is the session as the lanes see it: a record they mark is
// marked on the session once every record before it in the partition is.
type markInOrder struct {
	sarama.ConsumerGroupSession
	order *inOrder
}

func (s markInOrder) MarkMessage(msg *sarama.ConsumerMessage, metadata string) {
	s.order.acked(msg, metadata)
}

// inOrder keeps one partition's records between their hand-over to a lane
// and their mark, in offset order, and which lanes have records out: a
// lane holds one of the subscriber's slots while it has any, so that the
// slots bound the records being handled, not those queued in a lane
// behind one.
type inOrder struct {
	sess  sarama.ConsumerGroupSession
	slots chan struct{}

	mu      sync.Mutex
	pending []*sarama.ConsumerMessage // handed over, in offset order
	done    map[int64]string          // acked, not yet marked: metadata by offset
	laneAt  map[int64]int             // the lane of each record handed over and not acked
	out     map[int]int               // records handed over and not acked, by lane
	marked  int64                     // the offset after the last record marked, 0 before the first
}

// Next is the offset after the run of records, from the partition's head,
// that are acked or among offsets (middleware.Run); nothing once the
// session ended.
func (o *inOrder) Next(offsets []int64) (int64, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.sess.Context().Err() != nil {
		return 0, false
	}
	next := o.marked
	for _, msg := range o.pending {
		if _, acked := o.done[msg.Offset]; !acked && !slices.Contains(offsets, msg.Offset) {
			break
		}
		next = msg.Offset + 1
	}
	return next, next > 0
}

// fetched hands msg over to lane when the lane has records out already,
// and reports whether it did; otherwise the lane needs a slot first
// (opened).
func (o *inOrder) fetched(msg *sarama.ConsumerMessage, lane int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.out[lane] == 0 {
		return false
	}
	o.handOver(msg, lane)
	return true
}

// opened hands msg over to lane, which took a slot for it.
func (o *inOrder) opened(msg *sarama.ConsumerMessage, lane int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.handOver(msg, lane)
}

func (o *inOrder) handOver(msg *sarama.ConsumerMessage, lane int) {
	if o.out == nil {
		o.out, o.laneAt, o.done = map[int]int{}, map[int64]int{}, map[int64]string{}
	}
	o.pending = append(o.pending, msg)
	o.laneAt[msg.Offset] = lane
	o.out[lane]++
}

// lastMarked is the offset after the last record marked, 0 before the first.
func (o *inOrder) lastMarked() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.marked
}

// open counts the lanes that still have records out, and forgets them.
func (o *inOrder) open() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := len(o.out)
	clear(o.out)
	clear(o.laneAt)
	return n
}

// acked records msg's ack, gives its lane's slot back when it was the
// lane's last record out, and marks the longest run of acked records at the
// head of the partition, up to the last of them.
func (o *inOrder) acked(msg *sarama.ConsumerMessage, metadata string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if lane, ok := o.laneAt[msg.Offset]; ok {
		delete(o.laneAt, msg.Offset)
		if o.out[lane]--; o.out[lane] == 0 {
			delete(o.out, lane)
			<-o.slots
		}
	}
	if o.sess.Context().Err() != nil {
		// The session ended: the retry acks a record it yields to the
		// partition's next owner without applying it, so an ack now says
		// nothing of the record, and nothing of this session is committed.
		return
	}
	o.done[msg.Offset] = metadata
	var last *sarama.ConsumerMessage
	var lastMeta string
	i := 0
	for ; i < len(o.pending); i++ {
		meta, ok := o.done[o.pending[i].Offset]
		if !ok {
			break
		}
		delete(o.done, o.pending[i].Offset)
		last, lastMeta = o.pending[i], meta
	}
	if last == nil {
		return
	}
	clear(o.pending[:i]) // the records, and the fetch buffers they point into, are free to go
	o.pending = o.pending[i:]
	o.marked = last.Offset + 1
	o.sess.MarkMessage(last, lastMeta)
}
