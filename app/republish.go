package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/google/uuid"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/purchase"
)

// republishSummary is the republish command's help.
const republishSummary = "Writes every purchase's current state into the outbox for --topic, as the event of its current Version,\n" +
	"a batch per transaction, in id order; the promotion relay publishes them. It fills a new purchase topic\n" +
	"before a catalog rebuild from it (docs/runbooks/purchase-topic-changed.md). Safe while the processes run;\n" +
	"the consumer applies a republished event as a no-op. --after resumes past the last id it printed."

func runRepublish(ctx context.Context, args []string) error {
	var (
		dbURL, after string
		logs         logSettings
		cfg          purchase.RepublishConfig
	)
	s := newSettings("republish", republishSummary)
	s.str(&dbURL, "database-url", "DATABASE_URL", "", "PostgreSQL URL (required)")
	s.str(&cfg.Topic, "topic", "PROMOTION_TOPIC", event.Topic, "Kafka topic the republished events go to: the new purchase topic")
	s.int(&cfg.BatchSize, "batch-size", "REPUBLISH_BATCH_SIZE", purchase.RepublishBatchSizeDefault, "most purchases one transaction republishes")
	s.str(&after, "after", "REPUBLISH_AFTER", "", "resume past this purchase id (the last one a run printed)")
	logs.register(s)
	if err := s.parse(args); err != nil {
		return err
	}
	var errs []error
	if dbURL == "" {
		errs = append(errs, errors.New("database URL is required (--database-url or $DATABASE_URL)"))
	}
	if after != "" {
		id, err := uuid.Parse(after)
		if err != nil {
			errs = append(errs, fmt.Errorf("--after must be a purchase id, as a run prints it: %w", err))
		}
		cfg.After = id
	}
	errs = append(errs, cfg.Validate(), logs.validate())
	if err := errors.Join(errs...); err != nil {
		return err
	}
	log := logs.logger("republish")
	db, err := openCheckedPool(ctx, "republish", dbURL, 2, log)
	if err != nil {
		return err
	}
	defer db.Close()
	n, err := purchase.Republish(ctx, db, cfg, func(done int, last uuid.UUID) {
		log.Info("purchases republished", "count", done, "lastPurchaseId", last.String(), "topic", cfg.Topic)
	})
	fmt.Fprintf(os.Stdout, "republished %d purchases to %s\n", n, cfg.Topic)
	return err
}
