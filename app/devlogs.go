package main

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"sync"
)

// quietLogs is what promoflow dev shows of its two processes at INFO: what
// changes, and nothing of what a laptop demo does not need. Three kinds of
// INFO record go to DEBUG instead (LOG_LEVEL=debug shows them all):
//   - every record before both processes are ready and after dev begins to
//     stop: migrations, topics, listeners, Watermill's start-up and shutdown
//     (the banner and the ready line say what they would);
//   - Watermill's own records (handlers added and started, subscriptions,
//     Pub/Sub closed), whenever they come;
//   - an expirer cycle that expired nothing: its cycle started, batch
//     selected and cycle completed, three lines every EXPIRE_INTERVAL. A
//     cycle is judged by what it did, whenever it runs: one at start that
//     expires a backlog is shown, start-up or not.
//
// WARN and ERROR records always pass. The production processes (promotion,
// catalog) do not use it: they keep every seed record at INFO.
type quietLogs struct {
	// stop ends when dev begins to stop.
	stop context.Context

	mu      sync.Mutex
	isReady bool
	// cycle holds the records of the expirer cycle under way until it shows
	// whether it expires anything (its runId; "" for none).
	cycle     string
	cycleHeld []heldRecord
}

type heldRecord struct {
	h slog.Handler
	r slog.Record
}

// ready marks both processes as ready: what they log from now on is shown.
func (q *quietLogs) ready() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.isReady = true
}

// wrap is next with q's filter.
func (q *quietLogs) wrap(next slog.Handler) slog.Handler { return &quietHandler{q: q, next: next} }

type quietHandler struct {
	q    *quietLogs
	next slog.Handler
	// runID is the expirer cycle this handler logs for: the runId attribute
	// that handlers/expire adds with Logger.With.
	runID string
}

func (h *quietHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *quietHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	d := &quietHandler{q: h.q, next: h.next.WithAttrs(attrs), runID: h.runID}
	for _, a := range attrs {
		if a.Key == "runId" {
			d.runID = a.Value.String()
		}
	}
	return d
}

func (h *quietHandler) WithGroup(name string) slog.Handler {
	return &quietHandler{q: h.q, next: h.next.WithGroup(name), runID: h.runID}
}

func (h *quietHandler) Handle(ctx context.Context, r slog.Record) error {
	q := h.q
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case r.Level > slog.LevelInfo:
		q.release(ctx, slog.LevelInfo)
		return h.next.Handle(ctx, r)
	case r.Level < slog.LevelInfo:
		return h.next.Handle(ctx, r)
	case q.stop.Err() != nil:
		q.release(ctx, slog.LevelDebug) // a cycle cut short by the stop
		return h.debug(ctx, r)
	case h.runID != "":
		return h.cycleRecord(ctx, r) // before ready too: a cycle at start can expire a backlog
	case !q.isReady || fromWatermill(r):
		return h.debug(ctx, r)
	}
	return h.next.Handle(ctx, r)
}

// cycleRecord holds a cycle's records until the cycle shows whether it
// expired anything: an empty one goes to DEBUG whole, any other is shown
// whole, in its order and with its times.
func (h *quietHandler) cycleRecord(ctx context.Context, r slog.Record) error {
	q := h.q
	switch {
	case r.Message == "cycle started":
		q.release(ctx, slog.LevelInfo)
		q.cycle = h.runID
		q.cycleHeld = append(q.cycleHeld, heldRecord{h.next, r.Clone()})
		return nil
	case q.cycle == h.runID && r.Message == "batch selected" && attrIsZero(r, "count"):
		q.cycleHeld = append(q.cycleHeld, heldRecord{h.next, r.Clone()})
		return nil
	case r.Message == "cycle completed" &&
		attrIsZero(r, "ExpiredCount") && attrIsZero(r, "poisonCount") && attrIsZero(r, "SkippedLockedCount") && attrIsZero(r, "backlog"):
		if q.cycle == h.runID {
			q.release(ctx, slog.LevelDebug)
		}
		return h.debug(ctx, r)
	}
	q.release(ctx, slog.LevelInfo)
	return h.next.Handle(ctx, r)
}

// release writes the held cycle at level. The caller holds q.mu.
func (q *quietLogs) release(ctx context.Context, level slog.Level) {
	for _, held := range q.cycleHeld {
		held.r.Level = level
		if held.h.Enabled(ctx, level) {
			_ = held.h.Handle(ctx, held.r)
		}
	}
	q.cycle, q.cycleHeld = "", q.cycleHeld[:0]
}

func (h *quietHandler) debug(ctx context.Context, r slog.Record) error {
	if !h.next.Enabled(ctx, slog.LevelDebug) {
		return nil
	}
	r.Level = slog.LevelDebug
	return h.next.Handle(ctx, r)
}

// fromWatermill reports whether Watermill's slog adapter wrote r: the
// record's caller is in Watermill's module. Its messages are Watermill's to
// change, where it logs from is not.
func fromWatermill(r slog.Record) bool {
	if r.PC == 0 {
		return false
	}
	f, _ := runtime.CallersFrames([]uintptr{r.PC}).Next()
	return strings.HasPrefix(f.Function, "github.com/ThreeDotsLabs/watermill")
}

// attrIsZero reports whether r's attribute key is the number 0.
func attrIsZero(r slog.Record, key string) bool {
	zero := false
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != key {
			return true
		}
		v := a.Value.Resolve()
		zero = (v.Kind() == slog.KindInt64 && v.Int64() == 0) || (v.Kind() == slog.KindUint64 && v.Uint64() == 0)
		return false
	})
	return zero
}
