package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/rebuild"
)

// runRebuild rebuilds the PromotionBoost projection from the command line,
// as POST /admin/projections/rebuild does in a catalog process: one rebuild at
// a time in the whole cluster, catalog processes may keep consuming.
func runRebuild(ctx context.Context, args []string) error {
	var (
		common commonConfig
		cfg    rebuild.Config
		status bool
	)
	s := newSettings("rebuild", "Rebuilds the PromotionBoost projection blue/green: builds a new replica and every card's boost\n"+
		"beside the live projection from the purchase topic (a compacted changelog), catches up with the events\n"+
		"that arrive meanwhile, and switches to it in one short transaction. Readers and the catalog consumer go on\n"+
		"throughout; an interrupted rebuild leaves the live projection as it was. It refuses, changing nothing,\n"+
		"when the topic no longer holds every purchase. --status prints the newest rebuild.")
	common.registerStores(s)
	s.str(&cfg.Topic, "topic", "PROMOTION_TOPIC", event.Topic, "Kafka topic of purchase-changed events")
	s.bool(&status, "status", "REBUILD_STATUS", false, "print the newest rebuild's state as JSON and exit")
	s.int(&cfg.SwitchRecords, "switch-records", "REBUILD_SWITCH_RECORDS", rebuild.SwitchRecordsDefault,
		"catch up until at most this many records arrived since; the switch folds those in while it holds the writers back")
	s.int(&cfg.CatchUps, "catch-ups", "REBUILD_CATCH_UPS", rebuild.CatchUpsDefault, "most catch-ups before the switch")
	s.dur(&cfg.SwitchWait, "switch-wait", "REBUILD_SWITCH_WAIT", rebuild.SwitchWaitDefault,
		"longest the switch waits for a lock (a long reader of the replica) before it lets the writers go on and tries again")
	s.int(&cfg.SwitchMaxRecords, "switch-max-records", "REBUILD_SWITCH_MAX_RECORDS", rebuild.SwitchMaxRecordsDefault,
		"most records past the last catch-up the switch folds in while it holds the writers back; with more it gives way and catches up")
	s.dur(&cfg.SwitchStatementTimeout, "switch-statement-timeout", "REBUILD_SWITCH_STATEMENT_TIMEOUT",
		rebuild.SwitchStatementTimeoutDefault, "longest one statement of the switch runs before the switch gives way")
	s.dur(&cfg.SwitchIdleTimeout, "switch-idle-timeout", "REBUILD_SWITCH_IDLE_TIMEOUT", rebuild.SwitchIdleTimeoutDefault,
		"longest the switch's transaction pauses between two statements before PostgreSQL ends it, and its locks (a rebuild cut off from PostgreSQL)")
	s.int(&cfg.LoadSlice, "load-slice", "REBUILD_LOAD_SLICE", rebuild.LoadSliceDefault,
		"most records one transaction of the load builds the new replica from")
	db, log, err := common.openCommand(ctx, s, args, "rebuild")
	if err != nil {
		return err
	}
	defer db.Close()
	// --status reads the database alone; a rebuild reads the topic.
	connect := common.Kafka.connect
	if status {
		connect = func(context.Context, *slog.Logger) (kafkakit.Cluster, error) { return common.Kafka.cluster() }
	}
	if cfg.Kafka, err = connect(ctx, log); err != nil {
		return err
	}
	cfg.DB, cfg.Log = db, log
	rb, err := rebuild.New(cfg)
	if err != nil {
		return err
	}
	if status {
		st, err := rb.Status(ctx)
		if err != nil {
			return err
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	start := time.Now()
	stop := showProgress(ctx, "rebuild", rb.Live, log)
	st, err := rb.Run(ctx)
	stop()
	printRebuild(os.Stdout, st, time.Since(start))
	return err
}

// printRebuild writes the one line a rebuild ends with.
func printRebuild(w io.Writer, st rebuild.Status, took time.Duration) {
	fmt.Fprintf(w, "rebuild %s %s (phase %s): read %d, skipped %d, refused %d, purchases %d, contributions %d, "+
		"catch-ups %d, cards changed %d, duration %s\n", st.ID, st.State, st.Phase, st.Read, st.Skipped, st.Refused,
		st.Purchases, st.Contributions, st.CatchUps, st.CardsChanged, took.Round(time.Millisecond))
	for _, rf := range st.RefusedRecords {
		fmt.Fprintf(w, "  refused: partition %d offset %d (%s): %s\n", rf.Partition, rf.Offset, rf.Code, rf.Reason)
	}
}
