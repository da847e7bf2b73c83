package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/audit"
)

// errDrift makes the command exit 3: the audit ran and found drift it did not repair.
var errDrift = errors.New("drift found")

// auditReport is what `promoflow audit --json` prints.
type auditReport struct {
	Cards   audit.CardsReport    `json:"cards"`
	Replica *audit.ReplicaReport `json:"replica,omitempty"`
}

func runAudit(ctx context.Context, args []string) error {
	var (
		common                  commonConfig
		cfg                     audit.Config
		replica, repair, asJSON bool
	)
	s := newSettings("audit", "Checks the catalog's PromotionBoost projection: every card's boost against the sum of its active\n"+
		"contributions, and with --replica the contributions against the latest event of each purchase on the\n"+
		"purchase topic. --repair recomputes drifted cards as a card upsert would; safe while the consumer runs.\n"+
		"Exit status: 0 no drift (or all repaired), 3 drift left, 1 the audit failed.")
	common.registerStores(s)
	s.str(&cfg.Topic, "topic", "PROMOTION_TOPIC", event.Topic, "Kafka topic of purchase-changed events")
	s.str(&cfg.ConsumerGroup, "consumer-group", "CATALOG_CONSUMER_GROUP", router.CatalogConsumerGroup, "the catalog consumer's group (its unconsumed records are pending, not drift)")
	s.int(&cfg.Samples, "samples", "AUDIT_SAMPLES", audit.SamplesDefault, "how many drifted ids the report names")
	s.bool(&replica, "replica", "AUDIT_REPLICA", false, "also compare the replica with the latest event of each purchase on the topic")
	s.bool(&repair, "repair", "AUDIT_REPAIR", false, "recompute the drifted cards")
	s.bool(&asJSON, "json", "AUDIT_JSON", false, "print the report as JSON")
	db, log, err := common.openCommand(ctx, s, args, "audit")
	if err != nil {
		return err
	}
	defer db.Close()
	cfg.DB, cfg.Log = db, log
	if replica {
		if cfg.Kafka, err = common.Kafka.connect(ctx, log); err != nil {
			return err
		}
	}
	auditor, err := audit.New(cfg)
	if err != nil {
		return err
	}
	var rep auditReport
	if rep.Cards, err = auditor.Cards(ctx); err != nil {
		return err
	}
	if repair && rep.Cards.Drifted > 0 {
		if err := auditor.Repair(ctx, &rep.Cards); err != nil {
			return err
		}
	}
	if err := auditor.Record(ctx, rep.Cards, audit.SourceCommand); err != nil {
		return err
	}
	if replica {
		r, err := auditor.Replica(ctx)
		if err != nil {
			return err
		}
		rep.Replica = &r
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printAudit(os.Stdout, rep)
	}
	if rep.Cards.Drifted > rep.Cards.Repaired || (rep.Replica != nil && rep.Replica.Drifted > 0) {
		return errDrift
	}
	return nil
}

// printAudit writes the human summary.
func printAudit(w io.Writer, rep auditReport) {
	c := rep.Cards
	fmt.Fprintf(w, "cards: %d checked, %d drifted, %d repaired\n", c.Checked, c.Drifted, c.Repaired)
	for _, d := range c.Samples {
		fmt.Fprintf(w, "  %s %s: boost %d, replica says %d\n", d.Kind, d.ID, d.Stored, d.Want)
	}
	if r := rep.Replica; r != nil {
		fmt.Fprintf(w, "replica: %d purchases on the topic, %d drifted, %d pending (not consumed yet), %d unreadable records, "+
			"%d refused by PostgreSQL\n", r.Purchases, r.Drifted, r.Pending, r.Unreadable, r.Refused)
		for _, d := range r.Samples {
			fmt.Fprintf(w, "  %s: %s\n", d.PurchaseId, d.Problem)
		}
		for _, rf := range r.RefusedRecords {
			fmt.Fprintf(w, "  refused: partition %d offset %d (%s): %s\n", rf.Partition, rf.Offset, rf.Code, rf.Reason)
		}
		if r.Drifted > 0 {
			fmt.Fprintln(w, "  the replica is repaired by a DLQ replay or a projection rebuild (docs/runbooks/audit.md)")
		}
	}
}
