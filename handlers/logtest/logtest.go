// Package logtest captures slog records so that tests can assert what was logged.
package logtest

import (
	"context"
	"log/slog"
	"sync"
)

// Logs is a slog handler that keeps every record, for tests that assert on logs.
type Logs struct {
	mu      sync.Mutex
	records []slog.Record
	attrs   []slog.Attr
}

// Logger returns a logger writing into l.
func (l *Logs) Logger() *slog.Logger { return slog.New(l) }

func (l *Logs) Enabled(context.Context, slog.Level) bool { return true }

func (l *Logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r = r.Clone()
	r.AddAttrs(l.attrs...)
	l.records = append(l.records, r)
	return nil
}

func (l *Logs) WithAttrs(attrs []slog.Attr) slog.Handler {
	// Records share one store; attrs are added per derived handler.
	return &derived{root: l, attrs: attrs}
}

func (l *Logs) WithGroup(string) slog.Handler { return l }

// Find returns the attributes of every record with the given level and message.
func (l *Logs) Find(level slog.Level, msg string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, r := range l.records {
		if r.Level != level || r.Message != msg {
			continue
		}
		m := map[string]string{}
		r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
		out = append(out, m)
	}
	return out
}

// All returns every record, each as its message and its attributes in one
// line, for tests that assert what no log holds.
func (l *Logs) All() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.records))
	for _, r := range l.records {
		line := r.Message
		r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
		out = append(out, line)
	}
	return out
}

type derived struct {
	root  *Logs
	attrs []slog.Attr
}

func (d *derived) Enabled(context.Context, slog.Level) bool { return true }
func (d *derived) Handle(ctx context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(d.attrs...)
	return d.root.Handle(ctx, r)
}
func (d *derived) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &derived{root: d.root, attrs: append(append([]slog.Attr{}, d.attrs...), attrs...)}
}
func (d *derived) WithGroup(string) slog.Handler { return d }
