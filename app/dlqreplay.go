package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/bounded"
	"github.com/promoflow/promoflow/router/dlqreplay"
)

func runDLQReplay(ctx context.Context, args []string) error {
	var (
		common commonConfig
		cfg    dlqreplay.Config
		max    int
		list   bool
	)
	s := newSettings("dlq-replay", "Replays the Promotion Boost DLQ to the catalog-only replay topic with a Watermill forwarder.\n"+
		"It resumes where the last run with the same filters stopped, stops at the end it saw at the start,\n"+
		"and parks records replayed --max-replays times. Each original is replayed once, whatever the group:\n"+
		"the catalog database's ledger records it (--force replays again). --list shows what the DLQ holds and changes nothing.")
	common.registerStores(s)
	s.bool(&list, "list", "DLQ_REPLAY_LIST", false, "print what the DLQ holds by error code and reason, and exit; writes nothing")
	s.str(&cfg.DLQTopic, "dlq-topic", "CATALOG_DLQ_TOPIC", middleware.DLQTopicDefault, "dead-letter topic to read")
	s.str(&cfg.ReplayTopic, "replay-topic", "CATALOG_REPLAY_TOPIC", dlqreplay.ReplayTopicDefault, "topic the catalog consumer reads replays from")
	s.str(&cfg.SourceTopic, "source-topic", "PROMOTION_TOPIC", event.Topic, "purchase topic; the replay refuses to write to it")
	s.str(&cfg.Group, "group", "DLQ_REPLAY_GROUP", "", "consumer group that keeps the position (default: one per filter)")
	s.str(&cfg.Reason, "reason", "DLQ_REPLAY_REASON", "", "replay only records whose x-dlq-reason contains this")
	s.str(&cfg.ErrorCode, "error-code", "DLQ_REPLAY_ERROR_CODE", "", "replay only records with this x-dlq-error-code (contract_violation, conflict_exhausted, sql_rejected)")
	s.str(&cfg.ID, "id", "DLQ_REPLAY_ID", "", "replay only the records of this PurchaseId or MessageId")
	s.bool(&cfg.DryRun, "dry-run", "DLQ_REPLAY_DRY_RUN", false, "list what would be replayed and parked; publish and commit nothing")
	s.int(&max, "max", "DLQ_REPLAY_MAX", 0, "stop after this many replayed records (0: all)")
	s.int(&cfg.MaxReplays, "max-replays", "DLQ_REPLAY_MAX_REPLAYS", dlqreplay.MaxReplaysDefault, "park records already replayed this many times (x-dlq-replay-count)")
	s.float(&cfg.Rate, "rate", "DLQ_REPLAY_RATE", 0, "most records replayed per second (0: no cap)")
	s.bool(&cfg.Force, "force", "DLQ_REPLAY_FORCE", false, "replay dead letters whose original an earlier run replayed already (the ledger counts it again)")
	if err := s.parse(args); err != nil {
		return err
	}
	if err := errors.Join(common.logSettings.validate(), common.Kafka.validate()); err != nil {
		return err
	}
	if !list && common.DatabaseURL == "" {
		return dlqreplay.ErrNoLedger
	}
	log := common.logger("dlq-replay")
	stopTracing, err := setupTracing(ctx, "dlq-replay")
	if err != nil {
		return err
	}
	defer func() { _ = stopTracing(context.WithoutCancel(ctx)) }() // best effort flush at exit
	cluster, err := common.Kafka.connect(ctx, log)
	if err != nil {
		return err
	}
	if !list {
		db, err := openDB(ctx, "dlq-replay", common, log)
		if err != nil {
			return err
		}
		defer db.Close()
		cfg.DB = db
	}
	cfg.Kafka, cfg.Max, cfg.Log = cluster, int64(max), log
	replayer, err := dlqreplay.New(cfg)
	if err != nil {
		return err
	}
	what := "dlq-replay"
	if list {
		what = "dlq-list"
	}
	stop := showProgress(ctx, what, func() (bounded.Counts, bool) { return replayer.Progress().Snapshot(), true }, log)
	if list {
		listing, err := replayer.List(ctx)
		stop()
		if err != nil {
			return err
		}
		printListing(os.Stdout, listing)
		return nil
	}
	res, err := replayer.Run(ctx)
	stop()
	note := ""
	if cfg.DryRun {
		note = " (dry run: replayed = would replay; nothing published or committed)"
	}
	fmt.Fprintf(os.Stdout, "dlq-replay group %s: %s%s\n", res.Group, res.Summary(res.Duration), note)
	return err
}

// printListing writes the DLQ histogram as a table.
func printListing(w io.Writer, l dlqreplay.Listing) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CODE\tCOUNT\tPARKED\tOLDEST\tNEWEST\tREASON")
	for _, r := range l.Rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", r.Code, r.Count, r.Parked,
			r.Oldest.UTC().Format(time.RFC3339), r.Newest.UTC().Format(time.RFC3339), r.Reason)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "%d records in %s (%d partitions)\n", l.Records, l.Topic, l.Partitions)
}
