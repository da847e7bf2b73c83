package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/lmittmann/tint"
	"golang.org/x/term"
)

// Log formats of LOG_FORMAT.
const (
	logFormatAuto = "auto" // text on a terminal, JSON otherwise
	logFormatJSON = "json"
	logFormatText = "text"
)

// logSettings is how a command logs. Every command binds it, so --help lists
// both settings; every log goes to stderr, stdout is left to a command's output.
type logSettings struct {
	// LogLevel is debug, info, warn or error. Defaults to info.
	LogLevel string
	// LogFormat is auto, json or text. Defaults to auto.
	LogFormat string
}

func (l *logSettings) register(s *settings) {
	s.str(&l.LogLevel, "log-level", "LOG_LEVEL", "info", "debug, info, warn or error")
	s.str(&l.LogFormat, "log-format", "LOG_FORMAT", logFormatAuto,
		"auto, json or text: auto writes JSON when stderr is not a terminal (production, CI, compose) and a compact line for a person on a terminal")
}

func (l logSettings) validate() error {
	var errs []error
	if _, err := parseLevel(l.LogLevel); err != nil {
		errs = append(errs, err)
	}
	switch l.LogFormat {
	case logFormatAuto, logFormatJSON, logFormatText:
	default:
		errs = append(errs, fmt.Errorf("log format %q: want auto, json or text", l.LogFormat))
	}
	return errors.Join(errs...)
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("log level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// stderrIsTerminal is the one place that decides whether a person watches:
// the log format of auto, the progress bars and the demo's live table follow it.
func stderrIsTerminal() bool { return term.IsTerminal(int(os.Stderr.Fd())) }

// logger is the command's logger on stderr, tagged with the service name.
func (l logSettings) logger(service string) *slog.Logger {
	return slog.New(l.handler(os.Stderr, stderrIsTerminal())).With("service", service)
}

// handler writes records to w in the format LogFormat names; terminal says
// whether w is a terminal, which auto follows and which colours need.
//
// The text form is github.com/lmittmann/tint: slog's own TextHandler writes
// every line as time=2026-12-01T21:41:11.832901827Z level=INFO msg="cycle
// started" ..., a third of the width gone before the message. tint is one
// file with no dependencies of its own, takes slog's HandlerOptions as they
// are, and writes the same keys and values in a line a person reads at a
// glance: 21:41:11.832 INF cycle started service=promotion runId=... AsOf=...
// Both formats keep every key as it is spelled (docs/architecture.md, "Log keys").
func (l logSettings) handler(w io.Writer, terminal bool) slog.Handler {
	level, _ := parseLevel(l.LogLevel)
	if l.LogFormat == logFormatText || (l.LogFormat == logFormatAuto && terminal) {
		_, noColor := os.LookupEnv("NO_COLOR") // https://no-color.org
		return tint.NewTextHandler(w, &tint.Options{Level: level, TimeFormat: time.TimeOnly + ".000", NoColor: !terminal || noColor})
	}
	return slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})
}
