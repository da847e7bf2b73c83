package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLog_AutoIsJSONOffATerminalAndAPersonsLineOnOne: LOG_FORMAT=auto writes
// JSON when stderr is not a terminal (production, CI, compose), and a compact
// line on a terminal: time, level, message, then the keys as they are spelled.
func TestLog_AutoIsJSONOffATerminalAndAPersonsLineOnOne(t *testing.T) {
	t.Setenv("NO_COLOR", "1") // the terminal's colours would sit between the keys
	record := func(format string, terminal bool) string {
		var buf bytes.Buffer
		log := slog.New(logSettings{LogLevel: "info", LogFormat: format}.handler(&buf, terminal)).With("service", "promotion")
		log.Info("cycle completed", "runId", "r-1", "ExpiredCount", 2, "SkippedLockedCount", 0, "DurationMs", 7)
		return buf.String()
	}

	for _, line := range []string{record(logFormatAuto, false), record(logFormatJSON, true)} {
		var got map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &got), "not JSON: %s", line)
		require.Equal(t, "cycle completed", got["msg"])
		for _, key := range []string{"service", "runId", "ExpiredCount", "SkippedLockedCount", "DurationMs"} {
			require.Contains(t, got, key)
		}
	}
	for _, line := range []string{record(logFormatAuto, true), record(logFormatText, false)} {
		require.Regexp(t, `^\d\d:\d\d:\d\d\.\d{3} INF cycle completed service=promotion runId=r-1 ExpiredCount=2 SkippedLockedCount=0 DurationMs=7\n$`, line)
	}
}

func TestLog_AnUnknownFormatOrLevelIsRefused(t *testing.T) {
	err := logSettings{LogLevel: "loud", LogFormat: "yaml"}.validate()
	require.ErrorContains(t, err, `log format "yaml": want auto, json or text`)
	require.ErrorContains(t, err, `log level "loud"`)
	require.NoError(t, logSettings{LogLevel: "debug", LogFormat: logFormatText}.validate())
}

// TestHelp_EveryCommandListsLogFormat: each command binds LOG_FORMAT with its
// other settings, so its --help lists it.
func TestHelp_EveryCommandListsLogFormat(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"promotion", "catalog", "dev", "dlq-replay", "dlq replay", "dlq park", "audit", "rebuild", "migrate", "republish"} {
		t.Run(cmd, func(t *testing.T) {
			t.Parallel()
			code, out := runCommand(t, map[string]string{}, 30*time.Second, append(strings.Fields(cmd), "--help")...)
			require.Zero(t, code, out)
			require.Regexp(t, `--log-format +\$LOG_FORMAT +default auto`, out)
			require.False(t, strings.Contains(out, `"level"`), "help printed a log record:\n%s", out)
		})
	}
}
