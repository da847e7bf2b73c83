package boost

import (
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/event"
)

// Prepared holds ApplyBatch's statements prepared on a database, so that
// PostgreSQL parses and plans them once per connection: ApplyBatch sets
// plan_cache_mode force_generic_plan for its transaction. Planning the apply
// statement for each batch's arguments cost about a fifth of its time, and
// its generic plan reaches every table through a primary key or the project
// index, as its custom plans do (applySQL).
type Prepared struct {
	stmts map[string]*sqlx.Stmt
}

// Prepare prepares ApplyBatch's statements on db. Close releases them.
func Prepare(ctx context.Context, db *sqlx.DB) (*Prepared, error) {
	p := &Prepared{stmts: map[string]*sqlx.Stmt{}}
	for _, query := range []string{lockSQL, lockDroppedSQL, lockCardsSQL, applySQL} {
		stmt, err := db.PreparexContext(ctx, query)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("prepare boost statements: %w", err), p.Close())
		}
		p.stmts[query] = stmt
	}
	return p, nil
}

// Close releases the statements.
func (p *Prepared) Close() error {
	var errs []error
	for _, s := range p.stmts {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// genericPlanMaxTargets is the most targets a batch applies with the
// generic plans. Past it the statements are planned for their arguments:
// the generic plan joins the statement's own row sets by nested loops sized
// for a batch of events, and an event of 12,000 targets took about 6 s with
// it against 1 s planned for its arguments, whose planning is then no cost.
const genericPlanMaxTargets = 1000

// ApplyBatch is the package's ApplyBatch with the prepared statements, in
// tx; a batch of more than genericPlanMaxTargets targets runs as SQL text.
func (p *Prepared) ApplyBatch(ctx context.Context, tx *sqlx.Tx, evs []event.PurchaseChanged) ([]Outcome, error) {
	targets := 0
	for _, ev := range evs {
		targets += len(ev.Targets)
	}
	if targets > genericPlanMaxTargets {
		return applyBatch(ctx, plain(tx), evs)
	}
	// One round trip for both: the savepoint is lockEvents'.
	if _, err := tx.ExecContext(ctx, `SET LOCAL plan_cache_mode = force_generic_plan; SAVEPOINT `+lockSavepoint); err != nil {
		return nil, wrap("set plan cache mode", err)
	}
	return applyBatch(ctx, querier{tx: tx, stmts: p.stmts, savepoint: true}, evs)
}

// Apply is ApplyBatch with a batch of one.
func (p *Prepared) Apply(ctx context.Context, tx *sqlx.Tx, ev event.PurchaseChanged) (Outcome, error) {
	return first(p.ApplyBatch(ctx, tx, []event.PurchaseChanged{ev}))
}

// querier runs statements in the caller's transaction: the prepared ones
// when it has them, the SQL text otherwise.
type querier struct {
	tx    *sqlx.Tx
	stmts map[string]*sqlx.Stmt
	// savepoint is set when lockSavepoint was taken already.
	savepoint bool
}

func plain(tx *sqlx.Tx) querier { return querier{tx: tx} }

func (q querier) exec(ctx context.Context, query string, args ...any) error {
	if s, ok := q.stmts[query]; ok {
		_, err := q.tx.StmtxContext(ctx, s).ExecContext(ctx, args...)
		return err
	}
	_, err := q.tx.ExecContext(ctx, query, args...)
	return err
}

func (q querier) get(ctx context.Context, dest any, query string, args ...any) error {
	if s, ok := q.stmts[query]; ok {
		return q.tx.StmtxContext(ctx, s).GetContext(ctx, dest, args...)
	}
	return q.tx.GetContext(ctx, dest, query, args...)
}
