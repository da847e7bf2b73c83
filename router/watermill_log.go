package router

import (
	"context"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
)

// newWatermillLogger is Watermill's slog adapter on log that drops a Debug or
// Trace call whose level log does not write before it turns the call's
// fields into attributes: the router and the Kafka subscriber make several
// such calls per message, and the adapter converts every one.
func newWatermillLogger(log *slog.Logger) watermillLogger {
	return levelledLogger{LoggerAdapter: watermill.NewSlogLogger(log), log: log}
}

type levelledLogger struct {
	watermill.LoggerAdapter
	log *slog.Logger
}

func (l levelledLogger) Debug(msg string, fields watermill.LogFields) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.LoggerAdapter.Debug(msg, fields)
	}
}

func (l levelledLogger) Trace(msg string, fields watermill.LogFields) {
	if l.log.Enabled(context.Background(), watermill.LevelTrace) {
		l.LoggerAdapter.Trace(msg, fields)
	}
}

func (l levelledLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return levelledLogger{LoggerAdapter: l.LoggerAdapter.With(fields), log: l.log}
}
