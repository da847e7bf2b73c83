package kafkakit

import (
	"errors"
	"fmt"
	"time"
)

// A page of a transactional BatchPublisher (BeginPage … EndPage) is one
// Kafka transaction for all its Publishes, such as the outbox rows that a
// relay read in one position transaction: the transaction's round trips to
// the coordinator (AddPartitionsToTxn, often answered
// CONCURRENT_TRANSACTIONS while the previous transaction's markers are
// written, and EndTxn) are paid once a page instead of once a Publish.
//
//   - The page's first Publish begins the transaction, on the producer it
//     finds; its later ones add to it. A producer that was cut off or fenced
//     meanwhile aborts the page: its transaction dies with it.
//   - A Publish that fails aborts the page's transaction: nothing of the page
//     is visible to read_committed readers, every later Publish of the page
//     fails with ErrPageAborted, and the caller publishes the page again
//     whole, in a page of its own.
//   - EndPage(true) commits it, bounded by Timeout and the lease as a Publish
//     is, so that a process that lost its right to publish commits nothing;
//     EndPage(false) aborts it.
//
// A fenced Publish is tried again on a new producer (Publish) only when it
// is the page's first: the page's earlier records are in the fenced
// producer's transaction, which the new producer aborts.

// ErrPageAborted is a Publish or commit of a page whose Kafka transaction
// was aborted: nothing of the page is committed, and it must be published
// again whole.
var ErrPageAborted = errors.New("the page's kafka transaction was aborted")

// errProducerReplaced is why a page whose producer was cut off under it
// was aborted.
var errProducerReplaced = errors.New("its producer was cut off")

// page is the state of the page under way.
type page struct {
	conn      *producerConn // whose transaction holds the page; nil before its first Publish
	published int           // Publishes in it
	err       error         // why it was aborted
}

// BeginPage makes the Publishes that follow, until EndPage, one Kafka
// transaction. It aborts a page left open. Without a TransactionalID it
// does nothing: each Publish is sent on its own.
func (p *BatchPublisher) BeginPage() {
	if p.cfg.TransactionalID == "" {
		return
	}
	_ = p.EndPage(false)
	p.mu.Lock()
	p.page = &page{}
	p.mu.Unlock()
}

// EndPage ends the page under way: with commit, it commits the page's
// transaction and returns nil once Kafka did, or an error (ErrPageAborted
// when one of its Publishes failed); without, it aborts it. Outside a page,
// or on a page without a Publish, it does nothing.
func (p *BatchPublisher) EndPage(commit bool) error {
	p.mu.Lock()
	pg := p.page
	p.page = nil
	current := p.conn
	if pg != nil {
		// A copy: a Publish the caller gave up on (its deadline passed)
		// may still note its outcome, which then no longer counts.
		ended := *pg
		pg = &ended
	}
	p.mu.Unlock()
	if pg != nil && pg.conn != nil && (pg.err != nil || pg.conn != current) {
		pg.conn.paged.Store(false) // its transaction ended with the failure
	}
	switch {
	case pg == nil:
		return nil
	case pg.err != nil:
		if commit {
			return fmt.Errorf("commit the page: %w: %w", ErrPageAborted, pg.err)
		}
		return nil
	case pg.conn == nil:
		return nil
	case pg.conn != current:
		// Cut off since: the next producer of the id aborts its transaction.
		if commit {
			return fmt.Errorf("commit the page: %w: %w", ErrPageAborted, errProducerReplaced)
		}
		return nil
	}
	err, refused := p.run(pg.conn, time.Now().Add(p.cfg.Timeout), func() error { return pg.conn.endTransaction(commit) })
	if !commit {
		if err != nil || refused != nil {
			// A producer whose abort failed aborts nothing more: the next
			// one of the id aborts the transaction when it starts.
			p.cutOff(pg.conn)
		}
		return nil
	}
	if refused != nil {
		return fmt.Errorf("commit the page: %w", refused)
	}
	return p.transactionOutcome(pg.conn, fmt.Sprintf("commit a page of %d publishes", pg.published), err)
}

// joinPage is the page under way, which a Publish on conn joins; nil outside
// a page. A page that was aborted, or whose producer is not conn, refuses it.
func (p *BatchPublisher) joinPage(conn *producerConn) (*page, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pg := p.page
	switch {
	case pg == nil:
		return nil, nil
	case pg.err != nil:
		return pg, fmt.Errorf("%w: %w", ErrPageAborted, pg.err)
	case pg.conn == nil:
		pg.conn = conn
		conn.paged.Store(true)
	case pg.conn != conn:
		pg.err = errProducerReplaced
		return pg, fmt.Errorf("%w: %w", ErrPageAborted, pg.err)
	}
	return pg, nil
}

// notePage records the outcome of a Publish of pg (nil: none).
func (p *BatchPublisher) notePage(pg *page, err error) {
	if pg == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.page != pg {
		return // the page ended without this Publish's outcome
	}
	switch {
	case err == nil:
		pg.published++
	case pg.err == nil:
		pg.err = err
	}
}

// restartPage reports whether a fenced Publish may be tried again on a new
// producer: outside a page, or when it was the page's first (the page then
// starts afresh on the new producer).
func (p *BatchPublisher) restartPage() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	pg := p.page
	if pg == nil {
		return true
	}
	if pg.published > 0 {
		return false
	}
	*pg = page{}
	return true
}
