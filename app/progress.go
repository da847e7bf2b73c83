package main

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/promoflow/promoflow/router/bounded"
)

// progressLogEvery is how often long work logs its progress without a terminal.
const progressLogEvery = 5 * time.Second

// showProgress follows long work until the returned stop is called: a
// progress bar of offsets on a terminal (stderr), a log record every few
// seconds otherwise. Both name the phase of work of several phases.
func showProgress(ctx context.Context, what string, counts func() (bounded.Counts, bool), log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if stderrIsTerminal() {
		wg.Go(func() { drawBar(ctx, what, counts) })
	} else {
		wg.Go(func() { logProgress(ctx, what, counts, log) })
	}
	return func() { cancel(); wg.Wait() }
}

func drawBar(ctx context.Context, what string, counts func() (bounded.Counts, bool)) {
	bar := progressbar.NewOptions64(-1, progressbar.OptionSetWriter(os.Stderr), progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(), progressbar.OptionSetItsString("offsets"), progressbar.OptionShowIts(),
		progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	phase := ""
	for {
		if c, ok := counts(); ok {
			if c.Phase != phase {
				phase = c.Phase
				bar.Describe(what + ": " + phase)
			}
			if c.OffsetsTotal > 0 && bar.GetMax64() != c.OffsetsTotal {
				bar.ChangeMax64(c.OffsetsTotal)
			}
			_ = bar.Set64(c.OffsetsDone)
		}
		select {
		case <-ctx.Done():
			_ = bar.Finish()
			return
		case <-t.C:
		}
	}
}

func logProgress(ctx context.Context, what string, counts func() (bounded.Counts, bool), log *slog.Logger) {
	t := time.NewTicker(progressLogEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if c, ok := counts(); ok {
				log.Info(what+" progress", "phase", c.Phase, "offsetsDone", c.OffsetsDone, "offsetsTotal", c.OffsetsTotal,
					"read", c.Read, "matched", c.Matched, "replayed", c.Replayed, "parked", c.Parked, "skipped", c.Skipped)
			}
		}
	}
}
