package kafkakit

import (
	"cmp"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
//
// With a TransactionalID, each Publish is one Kafka transaction instead
// (transaction.go): what a frozen process had sent before it froze, or
// sends after it thaws, is aborted or refused by the brokers once another
// producer of the same id has started, whatever its own clock or sockets do.
type BatchPublisher struct {
	cfg BatchPublisherConfig

	mu   sync.Mutex
	conn *producerConn // nil after a cut-off: the next Publish makes one
	page *page         // the page under way (page.go); nil outside one

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
	// TransactionalID, when set, makes each Publish one Kafka transaction
	// of a producer with this transactional.id (transaction.go): a new
	// producer of the same id fences the one before it. Every process that
	// may take the place of another must use the same id. Optional.
	TransactionalID string
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

// NewBatchPublisher connects to the cluster. Its producer starts with the
// first Publish: a transactional one fences the producer of its id then, not
// while another process may still be the one that publishes.
func NewBatchPublisher(cfg BatchPublisherConfig) (*BatchPublisher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &BatchPublisher{cfg: cfg, send: (*producerConn).sendMessages}
	if err := p.current().connect(); err != nil {
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
// reach Kafka later from this call. With a TransactionalID, msgs are
// committed whole or not at all, and the error is never a *BatchError.
func (p *BatchPublisher) Publish(topic string, msgs ...*message.Message) error {
	deadline := time.Now().Add(p.cfg.Timeout)
	err := p.publish(topic, msgs, deadline)
	if errors.Is(err, ErrProducerFenced) && !p.leaseEnded() && time.Now().Before(deadline) && p.restartPage() {
		// A producer of another process fenced this one since its last
		// transaction (it held the outbox position meanwhile): this process
		// may write now, so its new producer fences that one in turn.
		err = p.publish(topic, msgs, deadline)
	}
	return err
}

// publish is one attempt of Publish, which ends by deadline.
func (p *BatchPublisher) publish(topic string, msgs []*message.Message, deadline time.Time) error {
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
	pg, err := p.joinPage(conn)
	if err != nil {
		return fmt.Errorf("produce %d messages: %w", len(msgs), err)
	}
	err, refused := p.run(conn, deadline, func() error { return p.send(conn, records) })
	if refused != nil {
		p.notePage(pg, refused)
		return fmt.Errorf("produce %d messages: %w", len(msgs), refused)
	}
	if conn.transactional() {
		err = p.transactionOutcome(conn, fmt.Sprintf("produce %d messages", len(msgs)), err)
		p.notePage(pg, err)
		return err
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

// run runs request, a request of conn, and waits for its outcome until
// deadline or the lease: past either, or when a write of it was refused for
// the lease, conn is cut off and refused says which.
func (p *BatchPublisher) run(conn *producerConn, deadline time.Time, request func() error) (err, refused error) {
	done := make(chan error, 1)
	conn.dialer.sending.Add(1)
	go func() {
		defer conn.dialer.sending.Add(-1)
		done <- request()
	}()
	if err, refused = p.await(conn, done, deadline); refused != nil {
		return nil, refused
	}
	if conn.dialer.leaseRefused.Load() {
		p.cutOff(conn)
		return nil, ErrLeaseExpired
	}
	return err, nil
}

// await waits for the send's outcome on done, and cuts conn off when the
// timeout or the lease passes first (refused says which).
func (p *BatchPublisher) await(conn *producerConn, done <-chan error, deadline time.Time) (err, refused error) {
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
		if p.cfg.TransactionalID != "" {
			transactional(sc, p.cfg.TransactionalID, p.cfg.Timeout)
		}
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

// Close aborts the page under way, if any, and flushes and closes the producer.
func (p *BatchPublisher) Close() error {
	_ = p.EndPage(false)
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

	txn      sync.Mutex  // one transaction at a time (transaction.go)
	txnOpen  bool        // under txn: a transaction is open
	paged    atomic.Bool // its transactions span a page's Publishes (page.go)
	unusable atomic.Bool // its transactions failed for good: the next Publish needs a new producer
}

// connect dials the client on first use. Once the dialer is fenced it fails at once.
func (c *producerConn) connect() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.connectLocked()
}

func (c *producerConn) connectLocked() error {
	if c.closed {
		return ErrFenced
	}
	if c.client != nil {
		return nil
	}
	sc := *c.config
	sc.Net.Proxy.Enable, sc.Net.Proxy.Dialer = true, c.dialer
	client, err := sarama.NewClient(c.brokers, &sc)
	if err != nil {
		return err
	}
	c.client = client
	return nil
}

// producer starts the producer on first use, on the client.
func (c *producerConn) producer() (sarama.SyncProducer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.connectLocked(); err != nil {
		return nil, err
	}
	if c.sync != nil {
		return c.sync, nil
	}
	producer, err := sarama.NewSyncProducerFromClient(c.client)
	if err != nil {
		return nil, err
	}
	c.sync = producer
	return producer, nil
}

func (c *producerConn) sendMessages(records []*sarama.ProducerMessage) error {
	return c.withProducer(func(producer sarama.SyncProducer) error {
		if c.transactional() {
			return c.sendTransaction(producer, records)
		}
		return producer.SendMessages(records)
	})
}

// withProducer runs request on the producer, which Close waits for.
func (c *producerConn) withProducer(request func(sarama.SyncProducer) error) error {
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
	return request(producer)
}

// close closes the producer once no send is under way. A fenced producer's
// client is closed first, so that its sends' retries end at once instead of
// waiting out their backoffs against a dialer that refuses them.
func (c *producerConn) close() error {
	c.mu.Lock()
	if c.closed || c.client == nil {
		c.closed = true
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	if c.sync == nil {
		return c.client.Close()
	}
	if c.dialer.isAborted() {
		_ = c.client.Close()
		c.sends.Wait()
		_ = c.sync.Close()
		return nil
	}
	c.sends.Wait()
	return errors.Join(c.sync.Close(), c.client.Close())
}
