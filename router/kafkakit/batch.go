package kafkakit

import (
	"cmp"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// BatchPublisher publishes the messages of one Publish call in one
// SendMessages of a durable producer (Cluster.DurableProducerConfig): one round trip
// for the batch instead of one per message. Each message stays one record,
// marshaled as watermill-kafka's Publisher would.
//
// A Publish that Kafka does not answer within its Timeout cuts its producer
// off for good (every connection reset, no new one dialed, fence.go) and
// fails with ErrPublishTimeout; the next Publish connects a new producer. So
// a caller that moves on after a timeout, such as a relay that lets another
// process take the outbox position, leaves nothing of it in flight that a
// cut network could deliver late, after newer records of the same keys.
type BatchPublisher struct {
	cfg BatchPublisherConfig

	mu   sync.Mutex
	conn *producerConn // nil after a cut-off: the next Publish makes one

	// send is SendMessages on a connection; tests stand in for it.
	send func(c *producerConn, records []*sarama.ProducerMessage) error
}

// BatchPublisherConfig configures a BatchPublisher.
type BatchPublisherConfig struct {
	// Cluster is where it publishes. Required.
	Cluster Cluster
	// ClientID names the producer to the brokers. Required.
	ClientID string
	// Marshaler turns a message into a record. Required.
	Marshaler kafka.Marshaler
	// Timeout bounds one Publish. Defaults to PublishTimeoutDefault.
	Timeout time.Duration
	// Lease, when set, is the time until which a Publish may write to
	// Kafka (outbox.PositionGuard.ValidUntil): none starts past it, and
	// once it passes during one, its producer is cut off at once (no later
	// write reaches a broker: fence.go) and the Publish fails with
	// ErrLeaseExpired. Optional.
	Lease func() time.Time
	// Pinned, when set, is the partition count to hash each topic's keys
	// over (PinnedHashPartitioner). Optional: Sarama's hash partitioner.
	Pinned func(topic string) int32
}

// PublishTimeoutDefault is a Publish's bound: past a broker's own wait for
// its replicas (Producer.Timeout, 10s in Sarama) and a leader election on a
// healthy cluster (a few seconds), well within the 30s a relay may stall.
const PublishTimeoutDefault = 10 * time.Second

// ErrPublishTimeout is a Publish that Kafka did not answer within the timeout.
var ErrPublishTimeout = errors.New("kafka did not answer within the publish timeout")

// ErrLeaseExpired is a Publish whose lease (BatchPublisherConfig.Lease) ended
// before it did: its producer was cut off, and nothing of it that was not on
// the wire by then can reach Kafka.
var ErrLeaseExpired = errors.New("the publisher's lease ended")

func (c *BatchPublisherConfig) setDefaults() {
	c.Timeout = cmp.Or(c.Timeout, PublishTimeoutDefault)
}

// Validate reports every missing or out-of-range setting.
func (c BatchPublisherConfig) Validate() error {
	c.setDefaults()
	var errs []error
	if err := c.Cluster.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.ClientID == "" {
		errs = append(errs, errors.New("producer client id is required"))
	}
	if c.Marshaler == nil {
		errs = append(errs, errors.New("producer marshaler is required"))
	}
	if c.Timeout <= 0 {
		errs = append(errs, errors.New("publish timeout must be positive"))
	}
	return errors.Join(errs...)
}

// NewBatchPublisher connects a durable producer to the cluster.
func NewBatchPublisher(cfg BatchPublisherConfig) (*BatchPublisher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &BatchPublisher{cfg: cfg, send: (*producerConn).sendMessages}
	if _, err := p.current().producer(); err != nil {
		return nil, fmt.Errorf("kafka producer: %w", err)
	}
	return p, nil
}

// Publish sends msgs to topic and returns once Kafka has acknowledged every
// one, or an error. Within a partition the records keep the order of msgs
// (idempotent producer, one request in flight). When Kafka refuses some of
// them, the error is a *BatchError; the others are on Kafka, and its
// Delivered names those a resend may leave out. When Kafka does not answer
// within the timeout, the error is ErrPublishTimeout, and none of msgs can
// reach Kafka later from this call.
func (p *BatchPublisher) Publish(topic string, msgs ...*message.Message) error {
	records := make([]*sarama.ProducerMessage, len(msgs))
	for i, msg := range msgs {
		r, err := p.cfg.Marshaler.Marshal(topic, msg)
		if err != nil {
			return fmt.Errorf("marshal message %s: %w", msg.UUID, err)
		}
		r.Metadata = msg.UUID
		records[i] = r
	}
	if p.leaseEnded() {
		return fmt.Errorf("produce %d messages: %w", len(msgs), ErrLeaseExpired)
	}
	conn := p.current()
	done := make(chan error, 1)
	conn.dialer.sending.Add(1)
	go func() {
		defer conn.dialer.sending.Add(-1)
		done <- p.send(conn, records)
	}()
	err, refused := p.await(conn, done)
	if refused != nil {
		return fmt.Errorf("produce %d messages: %w", len(msgs), refused)
	}
	if conn.dialer.leaseRefused.Load() {
		p.cutOff(conn)
		return fmt.Errorf("produce %d messages: %w", len(msgs), ErrLeaseExpired)
	}
	var perRecord sarama.ProducerErrors
	if errors.As(err, &perRecord) {
		be := &BatchError{Failed: make(map[string]error, len(perRecord)), Total: len(msgs)}
		for _, pe := range perRecord {
			uuid, _ := pe.Msg.Metadata.(string)
			be.Failed[uuid] = pe.Err
		}
		be.Delivered = delivered(records, be.Failed)
		return be
	}
	if err != nil {
		return fmt.Errorf("produce %d messages: %w", len(msgs), err)
	}
	return nil
}

// await waits for the send's outcome on done, and cuts conn off when the
// timeout or the lease passes first (refused says which).
func (p *BatchPublisher) await(conn *producerConn, done <-chan error) (err, refused error) {
	deadline := time.Now().Add(p.cfg.Timeout)
	for {
		wait := time.Until(deadline)
		if p.cfg.Lease != nil {
			wait = min(wait, leaseCheckInterval)
		}
		select {
		case err := <-done:
			return err, nil
		case <-time.After(wait):
		}
		switch {
		case !time.Now().Before(deadline):
			p.cutOff(conn)
			return nil, fmt.Errorf("%w (%s)", ErrPublishTimeout, p.cfg.Timeout)
		case p.leaseEnded():
			p.cutOff(conn)
			return nil, ErrLeaseExpired
		}
	}
}

// leaseCheckInterval is how often a Publish looks at its lease; a write past
// the lease is refused whenever it comes (fencedConn.Write).
const leaseCheckInterval = 10 * time.Millisecond

// leaseEnded reports whether the lease, if any, has passed.
func (p *BatchPublisher) leaseEnded() bool {
	return p.cfg.Lease != nil && !time.Now().Before(p.cfg.Lease())
}

// current is the connection the next Publish uses.
func (p *BatchPublisher) current() *producerConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		sc := p.cfg.Cluster.DurableProducerConfig(p.cfg.ClientID)
		if p.cfg.Pinned != nil {
			sc.Producer.Partitioner = PinnedHashPartitioner(p.cfg.Pinned)
		}
		p.conn = &producerConn{brokers: p.cfg.Cluster.Brokers, config: sc,
			dialer: newFencedDialer(sc.Net.DialTimeout, sc.Net.KeepAlive, p.cfg.Lease)}
	}
	return p.conn
}

// cutOff fences conn and drops it, so that the next Publish connects anew;
// its producer is closed in the background, where it can only fail.
func (p *BatchPublisher) cutOff(conn *producerConn) {
	conn.dialer.abort()
	p.mu.Lock()
	if p.conn == conn {
		p.conn = nil
	}
	p.mu.Unlock()
	go conn.close()
}

// Close flushes and closes the producer.
func (p *BatchPublisher) Close() error {
	p.mu.Lock()
	conn := p.conn
	p.conn = nil
	p.mu.Unlock()
	if conn == nil {
		return nil
	}
	return conn.close()
}

// producerConn is one producer and the dialer of its connections.
type producerConn struct {
	brokers []string
	config  *sarama.Config
	dialer  *fencedDialer

	mu     sync.Mutex // held while connecting, so concurrent sends share one producer
	client sarama.Client
	sync   sarama.SyncProducer
	closed bool
	// sends are the SendMessages under way: the producer is closed only
	// after them (Sarama panics on a send into a producer being closed).
	sends sync.WaitGroup
}

// producer connects on first use. Once the dialer is fenced it fails at once.
func (c *producerConn) producer() (sarama.SyncProducer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrFenced
	}
	if c.sync != nil {
		return c.sync, nil
	}
	sc := *c.config
	sc.Net.Proxy.Enable, sc.Net.Proxy.Dialer = true, c.dialer
	client, err := sarama.NewClient(c.brokers, &sc)
	if err != nil {
		return nil, err
	}
	producer, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	c.client, c.sync = client, producer
	return producer, nil
}

func (c *producerConn) sendMessages(records []*sarama.ProducerMessage) error {
	producer, err := c.producer()
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrFenced
	}
	c.sends.Add(1)
	c.mu.Unlock()
	defer c.sends.Done()
	return producer.SendMessages(records)
}

// close closes the producer once no send is under way. A fenced producer's
// client is closed first, so that its sends' retries end at once instead of
// waiting out their backoffs against a dialer that refuses them.
func (c *producerConn) close() error {
	c.mu.Lock()
	if c.closed || c.sync == nil {
		c.closed = true
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	if c.dialer.isAborted() {
		_ = c.client.Close()
		c.sends.Wait()
		_ = c.sync.Close()
		return nil
	}
	c.sends.Wait()
	return errors.Join(c.sync.Close(), c.client.Close())
}

// BatchError is a batch that Kafka did not acknowledge whole.
type BatchError struct {
	// Failed maps the UUID of each message Kafka did not acknowledge to its error.
	Failed map[string]error
	// Delivered holds the UUID of each message Kafka acknowledged and that no
	// refused message of the same key precedes in the batch: a resend may
	// leave these out and still keep every key's order. (An acknowledged
	// message behind a refused one of its key goes again after it, so that the
	// key's last record stays its newest.)
	Delivered map[string]bool
	// Total is the size of the batch.
	Total int
}

// delivered is BatchError.Delivered of records, in the order they were sent.
func delivered(records []*sarama.ProducerMessage, failed map[string]error) map[string]bool {
	out := make(map[string]bool, len(records)-len(failed))
	refusedKeys := map[string]bool{}
	for _, r := range records {
		uuid, _ := r.Metadata.(string)
		var key string
		if r.Key != nil {
			b, _ := r.Key.Encode()
			key = string(b)
		}
		switch {
		case failed[uuid] != nil:
			refusedKeys[key] = true
		case r.Key == nil || !refusedKeys[key]:
			out[uuid] = true
		}
	}
	return out
}

func (e *BatchError) Error() string {
	var first error
	for _, err := range e.Failed {
		first = err
		break
	}
	return fmt.Sprintf("kafka refused %d of %d messages: %v", len(e.Failed), e.Total, first)
}

// MessageError is the outcome of one message of a Publish that returned err:
// nil when Kafka acknowledged that message although others failed.
func MessageError(err error, uuid string) error {
	var be *BatchError
	if errors.As(err, &be) {
		return be.Failed[uuid]
	}
	return err
}
