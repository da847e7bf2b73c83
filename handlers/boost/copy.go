package boost

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"
)

// Bulk copies in short transactions. Every promotion relay on the server
// reads only the outbox rows below the oldest transaction that holds an xid
// (docs/architecture.md), so a transaction that writes for long holds every
// promotion event back, in any database of the server. The rebuild and the
// audit copy the whole topic: a Copier commits every ChunkRows rows, each
// chunk a transaction of its own, so that none of them holds an xid for
// longer than one chunk's COPY. It is the one piece of this package that
// begins and commits transactions: each chunk is its own unit of work.

// CopyChunkRowsDefault is the most rows one transaction of a Copier copies:
// about 0.1 s of COPY on a quiet server.
const CopyChunkRowsDefault = 10_000

// CopyConfig configures a Copier.
type CopyConfig struct {
	// DB takes the chunks, each in a transaction of its own. Required.
	DB *sqlx.DB
	// Schema and Table name the table (Schema empty: the search path), and
	// Columns the columns each row gives values for, in order. Required.
	Schema, Table string
	Columns       []string
	// ChunkRows is the most rows one transaction copies. Defaults to
	// CopyChunkRowsDefault.
	ChunkRows int
	// ChunkTime is the most time one transaction copies for: past it, the
	// transaction commits what it copied and the rest of its chunk goes in
	// the next one, so that no transaction holds its id for long, however
	// loaded the server is. Defaults to CopyChunkTimeDefault.
	ChunkTime time.Duration
	// Refused, when set, is told of each row that PostgreSQL refuses (a data
	// exception or an integrity violation: SQLSTATE class 22 or 23), which is
	// left out: its chunk is copied again without it, found by halving the
	// chunk. Nil: a refused row fails the copy.
	Refused func(row []any, err *pq.Error)
	// Committed, when set, runs after each chunk commits, with the rows
	// committed so far; an error ends the copy.
	Committed func(ctx context.Context, rows int64) error
}

// Validate reports every missing setting.
func (c CopyConfig) Validate() error {
	var errs []error
	if c.DB == nil {
		errs = append(errs, errors.New("copy: database is required"))
	}
	if c.Table == "" || len(c.Columns) == 0 {
		errs = append(errs, errors.New("copy: table and columns are required"))
	}
	if c.ChunkRows < 0 {
		errs = append(errs, errors.New("copy: chunk rows must be >= 0"))
	}
	if c.ChunkTime < 0 {
		errs = append(errs, errors.New("copy: chunk time must be >= 0"))
	}
	return errors.Join(errs...)
}

func (c *CopyConfig) setDefaults() {
	c.ChunkRows = cmp.Or(c.ChunkRows, CopyChunkRowsDefault)
	c.ChunkTime = cmp.Or(c.ChunkTime, CopyChunkTimeDefault)
}

// CopyChunkTimeDefault is the most time one transaction of a Copier copies
// for: what a chunk of CopyChunkRowsDefault takes on a quiet server, five
// times over.
const CopyChunkTimeDefault = 500 * time.Millisecond

// Copier copies rows into one table, a chunk at a time. Add fills a chunk
// while the one before is copied by a goroutine of its own, so that reading
// the rows and copying them overlap; at most two chunks are held in memory.
// It is safe for concurrent use.
type Copier struct {
	cfg CopyConfig
	ctx context.Context

	mu     sync.Mutex
	buf    [][]any
	closed bool

	chunks chan [][]any
	done   chan struct{} // closed when the copying goroutine ends
	err    error         // why it ended early; read after done
	rows   atomic.Int64
}

// NewCopier validates cfg (after defaults) and starts copying into its
// table; Close ends it. ctx bounds every chunk's transaction.
func NewCopier(ctx context.Context, cfg CopyConfig) (*Copier, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Copier{cfg: cfg, ctx: ctx, chunks: make(chan [][]any, 1), done: make(chan struct{})}
	go c.run()
	return c, nil
}

// Add adds one row, its values in the order of Columns. The error is that of
// a chunk copied before.
func (c *Copier) Add(values ...any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("copy into %s: the copier is closed", c.cfg.Table)
	}
	c.buf = append(c.buf, values)
	if len(c.buf) < c.cfg.ChunkRows {
		return nil
	}
	return c.send()
}

// send hands the filled chunk over, waiting while the one before is still
// queued; the caller holds mu.
func (c *Copier) send() error {
	chunk := c.buf
	c.buf = make([][]any, 0, c.cfg.ChunkRows)
	select {
	case c.chunks <- chunk:
		return nil
	case <-c.done:
		return c.err
	}
}

// Close copies what is left and waits until every row is committed.
func (c *Copier) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.done
		return c.err
	}
	c.closed = true
	var err error
	if len(c.buf) > 0 {
		err = c.send()
	}
	close(c.chunks)
	c.mu.Unlock()
	<-c.done
	return cmp.Or(c.err, err)
}

// Rows is how many rows were committed so far.
func (c *Copier) Rows() int64 { return c.rows.Load() }

// run copies the chunks in turn until they end or one fails.
func (c *Copier) run() {
	defer close(c.done)
	for chunk := range c.chunks {
		if err := c.copyRows(chunk); err != nil {
			c.err = err
			return
		}
	}
}

// copyRows copies rows in one transaction. A row PostgreSQL refuses fails
// the whole COPY; with Refused set, the rows are then copied again in two
// halves, down to the refused row alone, which is left out.
func (c *Copier) copyRows(rows [][]any) error {
	copied, err := c.copyTx(rows)
	if err == nil {
		n := c.rows.Add(int64(copied))
		if c.cfg.Committed != nil {
			if err := c.cfg.Committed(c.ctx, n); err != nil {
				return err
			}
		}
		if copied < len(rows) { // ChunkTime ran out
			return c.copyRows(rows[copied:])
		}
		return nil
	}
	pqErr, refused := refusal(err)
	if !refused || c.cfg.Refused == nil {
		return err
	}
	if len(rows) == 1 {
		c.cfg.Refused(rows[0], pqErr)
		return nil
	}
	half := len(rows) / 2
	if err := c.copyRows(rows[:half]); err != nil {
		return err
	}
	return c.copyRows(rows[half:])
}

// copyTx copies rows with one COPY in a transaction of its own, until they
// end or ChunkTime has passed, and returns how many it committed.
func (c *Copier) copyTx(rows [][]any) (int, error) {
	tx, err := c.cfg.DB.BeginTxx(c.ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("begin copy into %s: %w", c.cfg.Table, err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	query := pq.CopyInSchema(c.cfg.Schema, c.cfg.Table, c.cfg.Columns...)
	if c.cfg.Schema == "" {
		query = pq.CopyIn(c.cfg.Table, c.cfg.Columns...)
	}
	stmt, err := tx.PrepareContext(c.ctx, query)
	if err != nil {
		return 0, fmt.Errorf("copy into %s: %w", c.cfg.Table, err)
	}
	defer stmt.Close()
	deadline := time.Now().Add(c.cfg.ChunkTime)
	copied := 0
	for _, row := range rows {
		if copied > 0 && time.Now().After(deadline) {
			break
		}
		if _, err := stmt.ExecContext(c.ctx, row...); err != nil {
			return 0, fmt.Errorf("copy into %s: %w", c.cfg.Table, err)
		}
		copied++
	}
	if _, err := stmt.ExecContext(c.ctx); err != nil {
		return 0, fmt.Errorf("end copy into %s: %w", c.cfg.Table, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("commit copy into %s: %w", c.cfg.Table, err)
	}
	return copied, nil
}

// refusal reports whether err is PostgreSQL refusing a row's data: a data
// exception (class 22: a value out of range, malformed input) or an
// integrity violation (class 23).
func refusal(err error) (*pq.Error, bool) {
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) {
		return nil, false
	}
	class := pqErr.Code.Class()
	return pqErr, class == pqerror.ClassDataException || class == pqerror.ClassIntegrityConstraintViolation
}
