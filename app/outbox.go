package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/dberr"
	"github.com/promoflow/promoflow/handlers/outbox"
)

// promoflow outbox drain|thaw: the write freeze of a cutover (an upgrade by
// logical replication, a move to another cluster; docs/runbooks/cutover.md).

const outboxUsage = `Usage: promoflow outbox drain|thaw [flags]

  drain   freeze the promotion context's writes (every copy: the purchase API answers 503 with
          Retry-After, the expirer pauses), wait for the writers that began before the freeze,
          then for the relay to publish the whole outbox; exit 0 once it is empty. The freeze
          stays until thaw.
  thaw    lift the freeze: the purchase API and the expirer write again.

Run "promoflow outbox drain --help" for its settings.
`

// drainTimeoutDefault bounds the wait for an empty outbox: a relay that
// publishes nothing (no promotion process, Kafka down) must not hold a
// cutover's script for ever.
const drainTimeoutDefault = 10 * time.Minute

// drainPollDefault is how often drain reads the outbox.
const drainPollDefault = 200 * time.Millisecond

// drainProgressEvery is how often a long drain says what is left.
const drainProgressEvery = 5 * time.Second

// outboxCommand is what drain and thaw take.
type outboxCommand struct {
	DatabaseURL string
	Timeout     time.Duration
	Poll        time.Duration
	logs        logSettings
}

func runOutbox(ctx context.Context, args []string) error {
	action, args, err := action("outbox", args, []string{"drain", "thaw"}, outboxUsage)
	if err != nil {
		return err
	}
	var c outboxCommand
	summaries := map[string]string{
		"drain": "Freezes the promotion context's writes, waits until the relay has published the whole outbox, and exits 0; the freeze stays until `promoflow outbox thaw`.",
		"thaw":  "Lifts the write freeze that `promoflow outbox drain` set: the purchase API and the expirer write again.",
	}
	s := newSettings("outbox "+action, summaries[action])
	s.str(&c.DatabaseURL, "database-url", "DATABASE_URL", "", "PostgreSQL URL of the promotion context (required)")
	if action == "drain" {
		s.dur(&c.Timeout, "timeout", "OUTBOX_DRAIN_TIMEOUT", drainTimeoutDefault,
			"most time to wait for an empty outbox; then drain fails (exit 1) and the freeze stays")
		s.dur(&c.Poll, "poll", "OUTBOX_DRAIN_POLL", drainPollDefault, "how often drain reads the outbox")
	}
	c.logs.register(s)
	if err := s.parse(args); err != nil {
		return err
	}
	if err := c.validate(); err != nil {
		return err
	}
	name := "outbox-" + action
	db, err := openCheckedPool(ctx, name, c.DatabaseURL, 2, c.logs.logger(name))
	if err != nil {
		return err
	}
	defer db.Close()
	if action == "thaw" {
		return thaw(ctx, db, os.Stdout)
	}
	return drain(ctx, db, c, os.Stdout)
}

func (c outboxCommand) validate() error {
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("database URL is required (--database-url or $DATABASE_URL)"))
	}
	if c.Timeout < 0 || c.Poll < 0 {
		errs = append(errs, errors.New("--timeout and --poll must be positive durations, e.g. 10m and 200ms"))
	}
	return errors.Join(c.logs.validate(), errors.Join(errs...))
}

// drain sets the freeze, waits for the writers that may still write, then
// for the relay to publish everything, and says what it did on out.
func drain(ctx context.Context, db *sqlx.DB, c outboxCommand, out io.Writer) error {
	start := time.Now()
	f, isNew, err := outbox.SetFreeze(ctx, db)
	if err != nil {
		return refusedHint(ctx, db, err)
	}
	if isNew {
		fmt.Fprintf(out, "write freeze set at %s: outbox writers of every promotion process refuse (API 503, expirer paused)\n", stamp(f.At))
	} else {
		fmt.Fprintf(out, "write freeze already in force since %s (set by %s); kept\n", stamp(f.At), cmp.Or(f.By, "an unnamed session"))
	}
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(c.Timeout, drainTimeoutDefault))
	defer cancel()
	poll := cmp.Or(c.Poll, drainPollDefault)
	if err := waitFor(ctx, poll, func() (bool, error) {
		n, err := outbox.WritersBefore(ctx, db, f.ReadAt)
		return n == 0, err
	}); err != nil {
		return fmt.Errorf("wait for the outbox writers that began before the freeze: %w (the freeze stays; `promoflow outbox thaw` lifts it)", err)
	}
	var first, last int64 = -1, 0
	var said time.Time
	if err := waitFor(ctx, poll, func() (bool, error) {
		st, err := outbox.ReadStats(ctx, db)
		if err != nil {
			return false, err
		}
		switch {
		case first < 0:
			first = st.Backlog
			fmt.Fprintf(out, "outbox: %d event(s) to publish\n", first)
			said = time.Now()
		case st.Backlog > 0 && time.Since(said) >= drainProgressEvery:
			fmt.Fprintf(out, "outbox: %d event(s) left\n", st.Backlog)
			said = time.Now()
		}
		last = st.Backlog
		return st.Backlog == 0, nil
	}); err != nil {
		return fmt.Errorf("wait for an empty outbox (%d event(s) left; is a promotion process relaying to Kafka?): %w "+
			"(the freeze stays; `promoflow outbox thaw` lifts it)", last, err)
	}
	fmt.Fprintf(out, "outbox empty: %d event(s) published in %s; writes stay frozen until `promoflow outbox thaw`\n",
		first, time.Since(start).Round(time.Millisecond))
	return nil
}

// thaw lifts the freeze and says so on out.
func thaw(ctx context.Context, db *sqlx.DB, out io.Writer) error {
	f, lifted, err := outbox.LiftFreeze(ctx, db)
	if err != nil {
		return refusedHint(ctx, db, err)
	}
	if !lifted {
		fmt.Fprintln(out, "no write freeze was in force; nothing changed")
		return nil
	}
	fmt.Fprintf(out, "write freeze lifted (set at %s by %s, held %s): the purchase API and the expirer write again\n",
		stamp(f.At), cmp.Or(f.By, "an unnamed session"), f.ReadAt.Sub(f.At).Round(time.Millisecond))
	return nil
}

// refusedHint adds to err, when the database refused the freeze's write,
// where drain and thaw must run.
func refusedHint(ctx context.Context, db *sqlx.DB, err error) error {
	if dberr.ReadOnly(dberr.Classify(ctx, err, dberr.InRecovery(db.DB))) {
		return fmt.Errorf("%w: the database takes no writes (a standby, or default_transaction_read_only); "+
			"run it against the primary the promotion processes write to", err)
	}
	return err
}

// waitFor polls done every poll until it is true, fails, or ctx ends.
func waitFor(ctx context.Context, poll time.Duration, done func() (bool, error)) error {
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up after --timeout: %w", ctx.Err())
		case <-time.After(poll):
		}
	}
}

// stamp is t in UTC, to the millisecond.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }
