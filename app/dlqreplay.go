package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router"
)

func runDLQReplay(ctx context.Context, args []string) error {
	var (
		brokers, logLevel string
		cfg               router.DLQReplayConfig
		max               int
	)
	s := newSettings("dlq-replay", "Replays the Promotion Boost DLQ to the catalog-only replay topic with a Watermill forwarder.\n"+
		"It resumes where the last run with the same filters stopped, and stops at the end it saw at the start.")
	s.str(&brokers, "kafka-brokers", "KAFKA_BROKERS", "", "comma-separated Kafka bootstrap servers (required)")
	s.str(&logLevel, "log-level", "LOG_LEVEL", "info", "debug, info, warn or error")
	s.str(&cfg.DLQTopic, "dlq-topic", "CATALOG_DLQ_TOPIC", middleware.DLQTopicDefault, "dead-letter topic to read")
	s.str(&cfg.ReplayTopic, "replay-topic", "CATALOG_REPLAY_TOPIC", router.ReplayTopicDefault, "topic the catalog consumer reads replays from")
	s.str(&cfg.Group, "group", "DLQ_REPLAY_GROUP", "", "consumer group that keeps the position (default: one per filter)")
	s.str(&cfg.Reason, "reason", "DLQ_REPLAY_REASON", "", "replay only records whose x-dlq-reason contains this")
	s.str(&cfg.ErrorCode, "error-code", "DLQ_REPLAY_ERROR_CODE", "", "replay only records with this x-dlq-error-code (contract_violation, conflict_exhausted)")
	s.str(&cfg.ID, "id", "DLQ_REPLAY_ID", "", "replay only the records of this PurchaseId or MessageId")
	s.bool(&cfg.DryRun, "dry-run", "DLQ_REPLAY_DRY_RUN", false, "list what would be replayed; publish and commit nothing")
	s.int(&max, "max", "DLQ_REPLAY_MAX", 0, "stop after this many replayed records (0: all)")
	s.float(&cfg.Rate, "rate", "DLQ_REPLAY_RATE", 0, "most records replayed per second (0: no cap)")
	if err := s.parse(args); err != nil {
		return err
	}
	cfg.Brokers = splitList(brokers)
	cfg.Max = int64(max)
	if len(cfg.Brokers) == 0 {
		return errors.New("kafka brokers are required (--kafka-brokers or $KAFKA_BROKERS)")
	}
	if _, err := parseLevel(logLevel); err != nil {
		return err
	}
	res, err := router.ReplayDLQ(ctx, cfg, newLoggerTo(os.Stderr, logLevel, "dlq-replay"))
	if cfg.DryRun {
		fmt.Fprintf(os.Stdout, "group %s: read %d, would replay %d (dry run: nothing published or committed)\n", res.Group, res.Read, res.Matched)
	} else {
		fmt.Fprintf(os.Stdout, "group %s: read %d, matched %d, replayed %d\n", res.Group, res.Read, res.Matched, res.Forwarded)
	}
	return err
}
