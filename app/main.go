// Command promoflow runs the promotion and catalog contexts of the promotion
// pipeline, and their operator commands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/promoflow/promoflow/router/kafkakit"
)

const usage = `promoflow: promotion expiry and promotion boost pipeline.

Usage:
  promoflow dev [flags]          run both contexts in one process (embedded Kafka without $KAFKA_BROKERS)
  promoflow promotion [flags]    run the promotion context (purchase API, expirer, outbox relay)
  promoflow catalog [flags]      run the catalog context (Promotion Boost consumer, card feed, rebuild)
  promoflow dlq list|inspect|replay|park
                                 the Promotion Boost DLQ: what it holds, its records, replay them to the
                                 catalog consumer, dead-letter a record the consumer retries without end
  promoflow rebuild [flags]      rebuild the PromotionBoost projection from the purchase topic
  promoflow audit [flags]        check (and --repair) card boosts against the replica and the topic
  promoflow reconcile [flags]    after a database failover, repair purchases the topic holds and the database lacks
  promoflow status [flags]       one screen for on-call: expirer, outbox, consumer, DLQ, projection (exit 0: healthy)
  promoflow migrate up|status    apply or list the embedded database migrations
  promoflow republish [flags]    write every purchase's current state into the outbox (fills a new purchase topic)
  promoflow outbox drain|thaw    freeze promotion writes and wait until the outbox is published; lift the freeze
  promoflow version              print the version, the commit it was built from and the Go version (also --version)
  promoflow help                 show this help

Run "promoflow <command> --help" for the settings of a command.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "promoflow:", err)
		if errors.As(err, new(usageError)) {
			fmt.Fprint(os.Stderr, usage)
			os.Exit(2)
		}
		if errors.Is(err, errDrift) {
			os.Exit(3)
		}
		var coded interface{ ExitCode() int }
		if errors.As(err, &coded) {
			os.Exit(coded.ExitCode())
		}
		if errors.As(err, new(*kafkakit.RefusedError)) {
			os.Exit(exitKafkaRefused)
		}
		os.Exit(1)
	}
}

// exitKafkaRefused is the exit status of a command whose Kafka settings the
// brokers refuse (EX_CONFIG of sysexits.h): a restart with the same settings
// fails the same way.
const exitKafkaRefused = 78

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usageError{"a command is required"}
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "dev":
		return runDev(ctx, rest)
	case "promotion":
		return runPromotion(ctx, rest)
	case "catalog":
		return runCatalog(ctx, rest)
	case "dlq":
		return runDLQ(ctx, rest)
	case "dlq-replay":
		return runDLQReplayAlias(ctx, rest)
	case "rebuild":
		return runRebuild(ctx, rest)
	case "audit":
		return runAudit(ctx, rest)
	case "reconcile":
		return runReconcile(ctx, rest)
	case "status":
		return runStatus(ctx, rest)
	case "migrate":
		return runMigrate(ctx, rest)
	case "republish":
		return runRepublish(ctx, rest)
	case "outbox":
		return runOutbox(ctx, rest)
	case "version", "-version", "--version":
		if len(rest) > 0 {
			return usageError{fmt.Sprintf("%s takes no arguments", cmd)}
		}
		return runVersion(os.Stdout)
	case "help", "-h", "--help":
		fmt.Fprint(os.Stdout, usage)
		return nil
	}
	return usageError{fmt.Sprintf("unknown command %q", cmd)}
}

// usageError is a command line that names no known command; main prints the usage.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// runAll runs every part until ctx ends or one part fails, then stops the rest
// and waits for all of them. context.Canceled on shutdown is not an error.
func runAll(ctx context.Context, log *slog.Logger, parts ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(parts))
	for _, part := range parts {
		go func() {
			err := part(ctx)
			cancel()
			errc <- err
		}()
	}
	var errs []error
	for range parts {
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	log.Info("stopped")
	return errors.Join(errs...)
}
