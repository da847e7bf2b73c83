package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/rebuild"
)

// runRebuild rebuilds the PromotionBoost projection from the command line,
// as POST /admin/projections/rebuild does in a catalog process: one rebuild at
// a time in the whole cluster, catalog processes may keep consuming.
func runRebuild(ctx context.Context, args []string) error {
	var (
		common commonConfig
		topic  string
		status bool
		noPrep bool
	)
	s := newSettings("rebuild", "Rebuilds the PromotionBoost projection: resets contributions and card boosts, then replays the\n"+
		"purchase topic (a compacted changelog) from its earliest offset. It refuses, changing nothing, when the\n"+
		"topic no longer holds every purchase. Catalog processes may keep running. --status prints the newest rebuild.")
	common.registerStores(s)
	s.str(&topic, "topic", "PROMOTION_TOPIC", event.Topic, "Kafka topic of purchase-changed events")
	s.bool(&status, "status", "REBUILD_STATUS", false, "print the newest rebuild's state as JSON and exit")
	registerPreparedStatements(s, &noPrep)
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
	cluster, err := connect(ctx, log)
	if err != nil {
		return err
	}
	metrics, err := router.NewCatalogMetrics(prometheus.NewRegistry())
	if err != nil {
		return err
	}
	chain, closeChain, err := router.CatalogChain(db, metrics, log, router.CatalogConfig{Kafka: cluster, Topic: topic,
		DisablePreparedStatements: noPrep})
	if err != nil {
		return err
	}
	defer closeChain() //nolint:errcheck // statements of a connection pool about to close
	rb, err := rebuild.New(rebuild.Config{DB: db, Kafka: cluster, Topic: topic, Chain: chain, Log: log})
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
	fmt.Fprintf(os.Stdout, "rebuild %s %s: read %d, applied %d, duplicates %d, skipped %d, duration %s\n", st.ID, st.State,
		st.Read, st.Applied, st.Duplicates, st.Skipped, time.Since(start).Round(time.Millisecond))
	return err
}
