package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/dlqreplay"
	"github.com/promoflow/promoflow/router/status"
)

// Exit statuses of promoflow status: one bit per red part, added up, so a
// script reads which parts need someone. 1 keeps its meaning of every
// command (it could not run), and no sum of the bits is 1, 2, 3 or 78.
const (
	exitExpirerRed    = 4
	exitOutboxRed     = 8
	exitConsumerRed   = 16
	exitProjectionRed = 32
)

const statusSummary = `One screen for on-call, read from PostgreSQL and Kafka without asking any process: the expirer
(its last cycle, the due backlog and the oldest due purchase), the outbox (backlog, oldest event's
age, the relay's sessions and who holds its position, the writer that holds the relay back), the
Promotion Boost consumer (lag per partition, group members, the DLQ by reason) and the projection
(drift at the last card check, the newest rebuild). A part is red where an alert of
deploy/prometheus/alerts.yml would fire on what it shows (the limits below), or when it cannot be read.

Exit status: 0 every part healthy; otherwise the sum of 4 expirer red, 8 outbox red, 16 consumer
red, 32 projection red (e.g. 24: outbox and consumer; Kafka unreachable or refusing the settings
makes the consumer red, with the cause); 1 the status could not run (a bad setting, PostgreSQL
unreachable). With --watch it redraws until interrupted and exits with the last report's status.`

// statusExit ends the command with a red report's exit status.
type statusExit struct {
	code int
	red  []string
}

func (e statusExit) Error() string { return "red: " + strings.Join(e.red, ", ") }
func (e statusExit) ExitCode() int { return e.code }

// exitOf is the exit status of rep: nil when every part is healthy.
func exitOf(rep status.Report) error {
	var e statusExit
	for _, p := range []struct {
		name string
		red  bool
		bit  int
	}{{"expirer", rep.Expirer.Red(), exitExpirerRed}, {"outbox", rep.Outbox.Red(), exitOutboxRed},
		{"consumer", rep.Consumer.Red(), exitConsumerRed}, {"projection", rep.Projection.Red(), exitProjectionRed}} {
		if p.red {
			e.code += p.bit
			e.red = append(e.red, p.name)
		}
	}
	if e.code == 0 {
		return nil
	}
	return e
}

func runStatus(ctx context.Context, args []string) error {
	var (
		common commonConfig
		cfg    status.Config
		asJSON bool
		watch  time.Duration
	)
	s := newSettings("status", statusSummary)
	common.registerStores(s)
	s.str(&cfg.Topic, "topic", "PROMOTION_TOPIC", event.Topic, "Kafka topic of purchase-changed events")
	s.str(&cfg.ConsumerGroup, "consumer-group", "CATALOG_CONSUMER_GROUP", router.CatalogConsumerGroup, "the catalog consumer's group")
	s.str(&cfg.DeadLetters.DLQTopic, "dlq-topic", "CATALOG_DLQ_TOPIC", middleware.DLQTopicDefault, "dead-letter topic")
	s.int(&cfg.DeadLetters.MaxReplays, "max-replays", "DLQ_REPLAY_MAX_REPLAYS", dlqreplay.MaxReplaysDefault, "a dead letter replayed this many times counts as parked")
	registerLimits(s, &cfg.Limits)
	s.bool(&asJSON, "json", "STATUS_JSON", false, "print the report as JSON (with --watch: one line per report)")
	s.fs.Var((*watchValue)(&watch), "watch", "redraw every 2s, or every --watch=DURATION, until interrupted")
	s.fs.Lookup("watch").DefValue = "off"
	s.envs["watch"] = "STATUS_WATCH"
	db, log, err := common.openCommand(ctx, s, args, "status")
	if err != nil {
		return err
	}
	defer db.Close()
	warnDatabaseTLS(common, log)
	if cfg.Kafka, err = common.Kafka.cluster(); err != nil {
		return err
	}
	cfg.DB, cfg.Log = db, log
	reader, err := status.New(cfg)
	if err != nil {
		return err
	}
	show := func(rep status.Report) error { return printStatus(os.Stdout, rep, cfg.Limits) }
	if asJSON {
		show = jsonPrinter(os.Stdout, watch == 0)
	}
	if watch == 0 {
		rep := reader.Read(ctx)
		if err := show(rep); err != nil {
			return err
		}
		return exitOf(rep)
	}
	return watchStatus(ctx, reader, watch, show, !asJSON && term.IsTerminal(int(os.Stdout.Fd())))
}

// registerLimits binds the thresholds; their defaults are the alerts'.
func registerLimits(s *settings, l *status.Limits) {
	s.int(&l.ExpireBacklog, "expire-backlog-max", "STATUS_EXPIRE_BACKLOG_MAX", status.ExpireBacklogDefault,
		"most due purchases still Active (PromotionExpireBacklogHigh)")
	s.int(&l.OutboxBacklog, "outbox-backlog-max", "STATUS_OUTBOX_BACKLOG_MAX", status.OutboxBacklogDefault,
		"most events waiting in the outbox (PromotionOutboxBacklogHigh)")
	s.dur(&l.OutboxLag, "outbox-lag-max", "STATUS_OUTBOX_LAG_MAX", status.OutboxLagDefault,
		"greatest age of the oldest outbox event: the consumer's lag SLO, applied to the relay")
	s.dur(&l.HeldBack, "held-back-max", "STATUS_HELD_BACK_MAX", status.HeldBackDefault,
		"longest an outbox writer may run, holding the relay back (PromotionOutboxRelayHeldBack)")
	s.dur(&l.Lag, "lag-max", "STATUS_LAG_MAX", status.LagDefault,
		"greatest age of the oldest record the consumer has not handled (CatalogPromotionLagHigh, the SLO)")
	s.dur(&l.DeadLetterWindow, "dead-letter-window", "STATUS_DEAD_LETTER_WINDOW", status.DeadLetterWindowDef,
		"a dead letter newer than this is red (CatalogPromotionDeadLetters)")
	s.dur(&l.Stuck, "stuck-max", "STATUS_STUCK_MAX", status.StuckDefault,
		"longest the consumer may keep failing on one record of a partition (CatalogPartitionStuck)")
}

// watchValue is --watch (every 2s) or --watch=DURATION; false or 0 is off.
type watchValue time.Duration

// watchEveryDefault is the redraw period of a bare --watch.
const watchEveryDefault = 2 * time.Second

func (v *watchValue) String() string {
	if *v == 0 {
		return "off"
	}
	return time.Duration(*v).String()
}

func (v *watchValue) Set(s string) error {
	if b, err := strconv.ParseBool(s); err == nil {
		*v = watchValue(map[bool]time.Duration{true: watchEveryDefault}[b])
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return errors.New("want true, false or a duration such as 5s")
	}
	*v = watchValue(d)
	return nil
}

// IsBoolFlag lets a bare --watch stand for --watch=true.
func (v *watchValue) IsBoolFlag() bool { return true }

// watchStatus shows a report every period until ctx ends, and returns the
// last whole report's exit status.
func watchStatus(ctx context.Context, reader *status.Reader, every time.Duration, show func(status.Report) error, clear bool) error {
	var last error
	for {
		rep := reader.Read(ctx)
		if ctx.Err() != nil {
			return last // a report cut short by the interrupt says nothing
		}
		if clear {
			fmt.Fprint(os.Stdout, "\033[H\033[2J")
		}
		if err := show(rep); err != nil {
			return err
		}
		last = exitOf(rep)
		select {
		case <-ctx.Done():
			return last
		case <-time.After(every):
		}
	}
}

// statusJSON is a report as --json prints it: the report's fields, and the
// build of the promoflow that read it.
type statusJSON struct {
	Build build `json:"build"`
	status.Report
}

// jsonPrinter prints each report as JSON: indented once, or one line each.
func jsonPrinter(w io.Writer, indent bool) func(status.Report) error {
	enc := json.NewEncoder(w)
	if indent {
		enc.SetIndent("", "  ")
	}
	b := buildInfo()
	return func(rep status.Report) error { return enc.Encode(statusJSON{Build: b, Report: rep}) }
}
