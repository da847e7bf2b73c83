package bounded

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Progress counts what a bounded read did. It is safe for concurrent use and
// nil-safe for the offsets it advances.
type Progress struct {
	total, done atomic.Int64
	phase       atomic.Pointer[string]
	// Read counts records read.
	Read atomic.Int64
	// Matched counts records that passed the work's filter.
	Matched atomic.Int64
	// Replayed counts records forwarded (DLQ replay).
	Replayed atomic.Int64
	// Parked counts records left where they are on purpose (past --max-replays).
	Parked atomic.Int64
	// Skipped counts records that could not be used: they failed for good, or
	// (DLQ replay) a dead letter by reference names a record that is gone.
	Skipped atomic.Int64
}

// Plan sets the total offsets of ranges.
func (p *Progress) Plan(ranges []Range) { p.total.Store(offsets(ranges)) }

// Extend adds the offsets of ranges to the total: work that reads again past
// the ends it read before.
func (p *Progress) Extend(ranges []Range) { p.total.Add(offsets(ranges)) }

func offsets(ranges []Range) int64 {
	var n int64
	for _, r := range ranges {
		n += r.Len()
	}
	return n
}

// SetPhase names the step that work of several steps is in.
func (p *Progress) SetPhase(phase string) { p.phase.Store(&phase) }

func (p *Progress) advance(n int64) {
	if p != nil && n > 0 {
		p.done.Add(n)
	}
}

// CountReplayed is a handler middleware that counts every message its handler
// finished without error: the forwarded-message counter of a forwarder.
func (p *Progress) CountReplayed(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil {
			p.Replayed.Add(1)
		}
		return out, err
	}
}

// Counts is a snapshot of a Progress.
type Counts struct {
	// Phase is the step the work is in; empty for work of one step.
	Phase        string `json:"phase,omitempty"`
	OffsetsDone  int64  `json:"offsetsDone"`
	OffsetsTotal int64  `json:"offsetsTotal"`
	Read         int64  `json:"read"`
	Matched      int64  `json:"matched"`
	Replayed     int64  `json:"replayed"`
	Parked       int64  `json:"parked"`
	Skipped      int64  `json:"skipped"`
}

// Snapshot reads every counter.
func (p *Progress) Snapshot() Counts {
	var phase string
	if ph := p.phase.Load(); ph != nil {
		phase = *ph
	}
	return Counts{
		Phase:       phase,
		OffsetsDone: p.done.Load(), OffsetsTotal: p.total.Load(),
		Read: p.Read.Load(), Matched: p.Matched.Load(), Replayed: p.Replayed.Load(),
		Parked: p.Parked.Load(), Skipped: p.Skipped.Load(),
	}
}

// Summary is the one-line account every bounded command ends with.
func (c Counts) Summary(took time.Duration) string {
	return fmt.Sprintf("read %d, matched %d, replayed %d, parked %d, skipped %d, duration %s",
		c.Read, c.Matched, c.Replayed, c.Parked, c.Skipped, took.Round(time.Millisecond))
}
