package outbox

import (
	"database/sql"
	"sync"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

// PageEndMetadataKey marks, on a message the relay read, the last message of
// its page (RelaySchema): the page's publishes end with it.
const PageEndMetadataKey = "outbox_page_end"

// Pages is a publisher that can publish a page of the relay as one
// transaction (kafkakit.BatchPublisher with a transactional id).
type Pages interface {
	// BeginPage makes the publishes that follow one transaction; a page
	// left open is aborted.
	BeginPage()
	// EndPage commits the page's transaction (commit) and returns nil once
	// it is committed, or aborts it.
	EndPage(commit bool) error
}

// PageTransaction makes each page the relay reads (the rows of one position
// transaction) one transaction of its publisher, which commits before the
// page's ack can, so that the publisher's per-transaction round trips are
// paid once a page instead of once a message:
//
//   - a page's first message begins the publisher's page (Pages.BeginPage);
//   - its last one (PageEndMetadataKey) commits it once it is published,
//     within the position guard's lease, before the handler returns and so
//     before the subscriber acks the page;
//   - a failed publish or commit aborts the publisher's page, and the
//     handler fails as it would have without pages (a step back holds the
//     page to its ack deadline; a lost session makes the guard roll back); a
//     later message of that page is given up unpublished and rolls the
//     position transaction back;
//   - before the subscriber acks a page whose publishes did not end with a
//     commit (a failure, a step back, a shutdown mid-page), the page is
//     aborted and the position transaction rolled back (Offsets): the ack
//     fails, and the page is read again whole. An ack never commits rows
//     whose events are in an open or aborted transaction.
//
// Nothing else here begins or commits a transaction.
type PageTransaction struct {
	pages Pages

	mu     sync.Mutex
	tx     *sql.Tx // the position transaction whose page is open; nil between pages
	failed bool    // a publish or the commit of tx's page failed
}

// NewPageTransaction makes each page one transaction of pages.
func NewPageTransaction(pages Pages) *PageTransaction {
	return &PageTransaction{pages: pages}
}

// Middleware begins the publisher's page at a page's first message and
// commits it at its last; it aborts the page on any failure. It goes inside
// the position guard's middleware, so that the commit is a write within the
// lease. A message that does not come from the SQL subscriber (it has no
// transaction) is handled alone.
func (t *PageTransaction) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := wmsql.TxFromContext(msg.Context())
		if !ok {
			return h(msg)
		}
		t.mu.Lock()
		if t.tx != tx {
			t.tx, t.failed = tx, false
			t.pages.BeginPage()
		}
		failed := t.failed
		t.mu.Unlock()
		if failed {
			// Its earlier publishes are aborted: nothing of the page may be
			// acked, and the subscriber hands the rest over at once.
			_ = tx.Rollback()
			return nil, nil
		}
		out, err := h(msg)
		if err == nil && msg.Metadata.Get(PageEndMetadataKey) == "" {
			return out, nil
		}
		if err == nil {
			if err = t.pages.EndPage(true); err == nil {
				t.mu.Lock()
				if t.tx == tx {
					t.tx = nil
				}
				t.mu.Unlock()
				return out, nil
			}
		}
		t.mu.Lock()
		if t.tx == tx {
			t.failed = true
			_ = t.pages.EndPage(false)
		}
		t.mu.Unlock()
		return out, err
	}
}

// Offsets wraps the relay subscriber's offsets adapter: before the page's
// ack, a page that is still open (its publishes were not committed) is
// aborted and its transaction rolled back, so that the ack fails and the
// page is read again. A nil PageTransaction returns a as it is.
func (t *PageTransaction) Offsets(a wmsql.OffsetsAdapter) wmsql.OffsetsAdapter {
	if t == nil {
		return a
	}
	return pageOffsets{OffsetsAdapter: a, t: t}
}

type pageOffsets struct {
	wmsql.OffsetsAdapter
	t *PageTransaction
}

func (o pageOffsets) AckMessageQuery(topic string, row wmsql.Row, consumerGroup string) wmsql.Query {
	o.t.mu.Lock()
	tx := o.t.tx
	if tx != nil {
		o.t.tx = nil
		_ = o.t.pages.EndPage(false)
	}
	o.t.mu.Unlock()
	if tx != nil {
		_ = tx.Rollback()
	}
	return o.OffsetsAdapter.AckMessageQuery(topic, row, consumerGroup)
}
