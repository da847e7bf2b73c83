package kafkakit

import (
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// A BatchPublisher with a TransactionalID publishes each Publish as one
// Kafka transaction, so that a process frozen mid-publish (SIGSTOP, a long
// pause of its VM) cannot put anything on the topic once another process
// has taken its place, whatever it had built or sent before it froze:
//
//   - the producer starts (InitProducerId) with the first Publish after a
//     new BatchPublisher or a cut-off, so with the first publish of a process
//     that took the outbox position; the coordinator then aborts the open
//     transaction of the producer before it and bumps the id's epoch;
//   - the brokers refuse every later request of the old producer
//     (ProducerFenced), and its records already appended stay in an
//     aborted transaction, which read_committed consumers skip;
//   - a transaction left open by a process that never comes back is
//     aborted by the coordinator after TransactionTimeout.
//
// A fenced producer is cut off, and the Publish is tried once more on a new
// producer while the lease holds (the process took the position again after
// another one had it); otherwise the Publish fails with ErrProducerFenced.

// ErrProducerFenced is a Publish whose producer was fenced by a newer
// producer of its transactional id: another process published since.
var ErrProducerFenced = errors.New("kafka producer fenced by a newer producer of its transactional id")

// TransactionTimeoutMargin is how much longer than a Publish its Kafka
// transaction may stay open before the coordinator aborts it.
const TransactionTimeoutMargin = 5 * time.Second

// TransactionTimeout is the transaction timeout of a producer whose
// Publishes end within publishTimeout: a little longer, so that only a
// frozen or lost producer's transaction times out. It bounds how long such
// a transaction holds read_committed consumers back when no other producer
// of its id starts.
func TransactionTimeout(publishTimeout time.Duration) time.Duration {
	return publishTimeout + TransactionTimeoutMargin
}

// TransactionRetryBackoff is the first wait before a transaction request
// that the coordinator refused for a while is sent again, doubling with each
// retry up to transactionRetryBackoffMax. Most often it is the first
// AddPartitionsToTxn of a transaction, answered CONCURRENT_TRANSACTIONS
// while the coordinator still writes the previous one's markers, which
// takes a few milliseconds: Sarama's own 100 ms (20 ms for that request)
// would wait out several times that.
const TransactionRetryBackoff = 5 * time.Millisecond

// transactionRetryBackoffMax caps the retry wait: Sarama's own, so that its
// 50 retries still wait out a coordinator that moves (about 5 s in all).
const transactionRetryBackoffMax = 100 * time.Millisecond

// transactional makes sc a transactional producer of id whose Publishes end
// within publishTimeout.
func transactional(sc *sarama.Config, id string, publishTimeout time.Duration) {
	sc.Producer.Transaction.ID = id
	sc.Producer.Transaction.Timeout = TransactionTimeout(publishTimeout)
	sc.Producer.Transaction.Retry.BackoffFunc = transactionRetryBackoff
}

// transactionRetryBackoff is the wait before the retries-th retry (from 0)
// of a transaction request.
func transactionRetryBackoff(retries, _ int) time.Duration {
	return min(TransactionRetryBackoff<<min(retries, 10), transactionRetryBackoffMax)
}

func (c *producerConn) transactional() bool { return c.config.Producer.Transaction.ID != "" }

// sendTransaction sends records in the open transaction, or in one it
// begins. Outside a page the transaction is committed whole or aborted; in
// one (paged) it stays open for the page's next Publish, and a failure
// aborts it. A producer whose transactions can no longer succeed (Sarama's
// fatal state, or an abort that failed) is marked unusable.
func (c *producerConn) sendTransaction(producer sarama.SyncProducer, records []*sarama.ProducerMessage) error {
	c.txn.Lock()
	defer c.txn.Unlock()
	if !c.txnOpen {
		if err := producer.BeginTxn(); err != nil {
			c.unusable.Store(true)
			return fmt.Errorf("begin transaction: %w", err)
		}
		c.txnOpen = true
	}
	err := producer.SendMessages(records)
	if err == nil && c.paged.Load() {
		return nil
	}
	return c.endLocked(producer, err == nil, err)
}

// endTransaction commits the open transaction, if any, or aborts it, and
// ends the page's span of it.
func (c *producerConn) endTransaction(commit bool) error {
	defer c.paged.Store(false)
	return c.withProducer(func(producer sarama.SyncProducer) error {
		c.txn.Lock()
		defer c.txn.Unlock()
		if !c.txnOpen {
			return nil
		}
		return c.endLocked(producer, commit, nil)
	})
}

// endLocked ends the open transaction: it commits when commit is set and
// err, the transaction's error so far, is nil, and aborts otherwise. It
// returns the transaction's error.
func (c *producerConn) endLocked(producer sarama.SyncProducer, commit bool, err error) error {
	c.txnOpen = false
	if err == nil && commit {
		if err = producer.CommitTxn(); err == nil {
			return nil
		}
		err = fmt.Errorf("commit transaction: %w", err)
	}
	if abortErr := producer.AbortTxn(); abortErr != nil {
		c.unusable.Store(true)
		err = errors.Join(err, fmt.Errorf("abort transaction: %w", abortErr))
	}
	if producer.TxnStatus()&sarama.ProducerTxnFlagFatalError != 0 {
		c.unusable.Store(true)
	}
	return err
}

// transactionOutcome is the error of what, a transactional request on
// conn (a Publish, a page's commit) that returned err. A fenced or unusable
// producer is cut off, so that the next Publish starts a new one.
func (p *BatchPublisher) transactionOutcome(conn *producerConn, what string, err error) error {
	if err == nil {
		return nil
	}
	if fenced(err) {
		p.cutOff(conn)
		return fmt.Errorf("%s: %w: %w", what, ErrProducerFenced, err)
	}
	if conn.unusable.Load() {
		p.cutOff(conn)
	}
	return fmt.Errorf("%s in a transaction: %w", what, err)
}

// fenced reports whether err, or an error of one of its records, says a
// newer producer of the transactional id started.
func fenced(err error) bool {
	if errors.Is(err, sarama.ErrProducerFenced) || errors.Is(err, sarama.ErrInvalidProducerEpoch) {
		return true
	}
	var perRecord sarama.ProducerErrors
	if errors.As(err, &perRecord) {
		for _, pe := range perRecord {
			if fenced(pe.Err) {
				return true
			}
		}
	}
	return false
}
