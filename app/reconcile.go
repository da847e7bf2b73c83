package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/google/uuid"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/reconcile"
)

func runReconcile(ctx context.Context, args []string) error {
	var (
		common commonConfig
		cfg    reconcile.Config
		asJSON bool
	)
	s := newSettings("reconcile", "After a failover of the promotion database: reads the purchase topic from its earliest offset to\n"+
		"its end now, and for every purchase that the database lacks or holds at a lower version (a phantom: the\n"+
		"relay published a change the promoted standby never received) writes the database's truth through the\n"+
		"outbox at the topic's version + 1; a purchase the database lacks becomes a Cancelled row, so its boost\n"+
		"ends. Run it against the new primary, with the relay running. A second run finds nothing.\n"+
		"Exit status: 0 done (or nothing found), 1 it failed.")
	common.registerStores(s)
	s.str(&cfg.Topic, "topic", "PROMOTION_TOPIC", event.Topic, "Kafka topic of purchase-changed events")
	s.bool(&cfg.DryRun, "dry-run", "RECONCILE_DRY_RUN", false, "find and print the phantoms, write nothing")
	s.bool(&asJSON, "json", "RECONCILE_JSON", false, "print the report as JSON")
	db, log, err := common.openCommand(ctx, s, args, "reconcile")
	if err != nil {
		return err
	}
	defer db.Close()
	cfg.DB, cfg.Log = db, log
	if cfg.Kafka, err = common.Kafka.connect(ctx, log); err != nil {
		return err
	}
	rep, err := reconcile.Run(ctx, cfg)
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printReconcile(os.Stdout, rep, cfg.DryRun)
	return nil
}

// printReconcile writes the human summary.
func printReconcile(w io.Writer, rep reconcile.Report, dryRun bool) {
	fmt.Fprintf(w, "topic: %d records, %d purchases, %d unreadable records\n", rep.Records, rep.Purchases, rep.Unreadable)
	fmt.Fprintf(w, "phantoms: %d missing from the database, %d behind the topic\n", len(rep.Missing), len(rep.Behind))
	for _, list := range []struct {
		what string
		ids  []uuid.UUID
	}{{"missing (now Cancelled)", rep.Missing}, {"behind (state published again)", rep.Behind}} {
		for _, id := range list.ids {
			fmt.Fprintf(w, "  %s: %s\n", list.what, id)
		}
	}
	if dryRun {
		fmt.Fprintln(w, "dry run: nothing written")
		return
	}
	fmt.Fprintf(w, "repaired: %d, written through the outbox; the relay publishes them\n", rep.Repaired)
}
