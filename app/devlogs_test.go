package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// shownRecords decodes JSON log lines as "LEVEL message" each.
func shownRecords(t *testing.T, buf *bytes.Buffer) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var r struct{ Level, Msg string }
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		out = append(out, r.Level+" "+r.Msg)
	}
	buf.Reset()
	return out
}

// TestDevLogs_AnEmptyExpirerCycleGoesToDebugAndOneThatExpiresIsShownWhole
// runs the real expirer on PostgreSQL through dev's logs: a cycle that
// expires nothing is three DEBUG lines, one that expires is shown whole at
// INFO, in its order, cycle started and batch selected included.
func TestDevLogs_AnEmptyExpirerCycleGoesToDebugAndOneThatExpiresIsShownWhole(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	var buf bytes.Buffer
	q := &quietLogs{stop: context.Background()}
	q.ready()
	exp, err := expire.New(db, expire.Config{}, slog.New(q.wrap(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	require.NoError(t, err)

	_, err = exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{"DEBUG cycle started", "DEBUG batch selected", "DEBUG cycle completed"}, shownRecords(t, &buf))

	purchasetest.SeedActive(t, db, 2, time.Now().Add(-time.Second))
	_, err = exp.RunCycle(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{"INFO cycle started", "INFO batch selected", "INFO promotion expired", "INFO promotion expired", "INFO cycle completed"},
		shownRecords(t, &buf))
}

// TestDevLogs_StartUpShutdownAndWatermillChatterGoToDebug: before both
// processes are ready and once dev stops, INFO records go to DEBUG, and so do
// Watermill's own at any time; a warning always shows, and at LOG_LEVEL=info
// nothing of the rest is written.
func TestDevLogs_StartUpShutdownAndWatermillChatterGoToDebug(t *testing.T) {
	stop, stopNow := context.WithCancel(context.Background())
	for _, level := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
		var buf bytes.Buffer
		q := &quietLogs{stop: stop}
		log := slog.New(q.wrap(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level})))
		wm := watermill.NewSlogLogger(log)

		log.Info("migrations applied")
		wm.Info("Adding handler", watermill.LogFields{"handler_name": "expire_promotions"})
		log.Warn("no API tokens configured")
		q.ready()
		wm.Info("Starting handler", nil)
		log.Info("consumed")
		if level == slog.LevelDebug {
			require.Equal(t, []string{"DEBUG migrations applied", "DEBUG Adding handler", "WARN no API tokens configured",
				"DEBUG Starting handler", "INFO consumed"}, shownRecords(t, &buf))
		} else {
			require.Equal(t, []string{"WARN no API tokens configured", "INFO consumed"}, shownRecords(t, &buf))
		}
	}

	var buf bytes.Buffer
	q := &quietLogs{stop: stop}
	q.ready()
	log := slog.New(q.wrap(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	stopNow()
	log.Info("stopped")
	log.Error("http shutdown")
	require.Equal(t, []string{"DEBUG stopped", "ERROR http shutdown"}, shownRecords(t, &buf))
}

// TestDevLogs_ACycleThatStartedBeforeReadyIsJudgedByWhatItDid: a cycle that
// runs while dev becomes ready goes to DEBUG whole when it expires nothing,
// and is shown whole when it does.
func TestDevLogs_ACycleThatStartedBeforeReadyIsJudgedByWhatItDid(t *testing.T) {
	for _, expired := range []int{0, 1} {
		var buf bytes.Buffer
		q := &quietLogs{stop: context.Background()}
		log := slog.New(q.wrap(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))).With("runId", "r-1")
		log.Info("cycle started", "AsOf", time.Now())
		q.ready()
		log.Info("batch selected", "count", expired)
		log.Info("cycle completed", "ExpiredCount", expired, "poisonCount", 0, "SkippedLockedCount", 0, "backlog", 0)
		level := map[int]string{0: "DEBUG", 1: "INFO"}[expired]
		require.Equal(t, []string{level + " cycle started", level + " batch selected", level + " cycle completed"}, shownRecords(t, &buf),
			"a cycle that expired %d", expired)
	}
}
