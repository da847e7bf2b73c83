package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
)

// promoflow dlq list|inspect|replay|park: the Promotion Boost DLQ, and an
// operator's way past a record the consumer retries without end.

const dlqUsage = `Usage: promoflow dlq list|inspect|replay|park [flags]

  list     what the DLQ holds, by error code and reason; changes nothing
  inspect  the DLQ records that --id, --reason or --error-code select, as a replay would see
           them; publishes and commits nothing (a dry run of replay)
  replay   replay the DLQ to the catalog-only replay topic (resumes where the last run with
           the same filters stopped)
  park     ask the consumer that owns --partition to dead-letter the record at --offset, with
           --reason, the next time it fails, and go on (a record retried without end: its
           error is transient or systemic for that record alone); needs the catalog's database

Run "promoflow dlq <action> --help" for its settings. "promoflow dlq-replay" is the
former name of "promoflow dlq replay", kept for one release.
`

// dlqActions are the actions of promoflow dlq.
var dlqActions = []string{"list", "inspect", "replay", "park"}

func runDLQ(ctx context.Context, args []string) error {
	action, rest, err := action("dlq", args, dlqActions, dlqUsage)
	if err != nil {
		return err
	}
	switch action {
	case "list":
		return runDLQReplay(ctx, append([]string{"--list"}, rest...))
	case "inspect":
		return runDLQReplay(ctx, append([]string{"--dry-run"}, rest...))
	case "replay":
		return runDLQReplay(ctx, rest)
	}
	return runDLQPark(ctx, rest)
}

// runDLQReplayAlias is the former command name: it says so and runs replay.
func runDLQReplayAlias(ctx context.Context, args []string) error {
	fmt.Fprintln(os.Stderr, `promoflow: "dlq-replay" is deprecated and goes in the next release: use "promoflow dlq replay" (or "dlq list" for --list)`)
	return runDLQReplay(ctx, args)
}

// dlqParkCommand is what promoflow dlq park takes.
type dlqParkCommand struct {
	DatabaseURL string
	Partition   int
	Offset      int
	req         middleware.ParkRequest
	logs        logSettings
}

func runDLQPark(ctx context.Context, args []string) error {
	c := dlqParkCommand{Partition: -1, Offset: -1}
	s := newSettings("dlq park", "Writes a park request to the catalog database: the consumer that owns the partition dead-letters "+
		"the record at the offset, with the reason, the next time it fails (its next retry), and goes on. "+
		"A CLI cannot commit a live member's offset; the consumer does it.")
	s.str(&c.DatabaseURL, "database-url", "DATABASE_URL", "", "PostgreSQL URL of the catalog context (required)")
	s.str(&c.req.Topic, "topic", "PROMOTION_TOPIC", event.Topic, "topic of the record (the purchase topic, or the replay topic)")
	s.int(&c.Partition, "partition", "DLQ_PARK_PARTITION", -1, "partition of the record (required)")
	s.int(&c.Offset, "offset", "DLQ_PARK_OFFSET", -1, "offset of the record (required; `promoflow status` shows a stuck partition's)")
	s.str(&c.req.Reason, "reason", "DLQ_PARK_REASON", "", "why, written to the dead letter's x-dlq-reason (required)")
	c.logs.register(s)
	if err := s.parse(args); err != nil {
		return err
	}
	c.req.Partition, c.req.Offset = int32(c.Partition), int64(c.Offset)
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("database URL is required (--database-url or $DATABASE_URL)"))
	}
	if c.Partition < 0 {
		errs = append(errs, errors.New("--partition is required (0 or more)"))
	}
	if c.Offset < 0 {
		errs = append(errs, errors.New("--offset is required (0 or more)"))
	}
	if len(errs) == 0 {
		errs = append(errs, c.req.Validate())
	}
	if err := errors.Join(c.logs.validate(), errors.Join(errs...)); err != nil {
		return err
	}
	db, err := openCheckedPool(ctx, "dlq-park", c.DatabaseURL, 1, c.logs.logger("dlq-park"))
	if err != nil {
		return err
	}
	defer db.Close()
	if err := middleware.RequestPark(ctx, db, c.req); err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "park request written: the consumer that owns partition %d of %s dead-letters offset %d "+
		"(reason %q) the next time it fails, and goes on; `promoflow dlq list` shows it as code %s\n",
		c.req.Partition, c.req.Topic, c.req.Offset, c.req.Reason, middleware.CodeParked)
	return nil
}
