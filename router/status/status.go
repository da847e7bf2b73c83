// Package status reads, in one pass and without asking any process, whether
// the promotion pipeline is healthy: the expirer, the outbox relay, the
// Promotion Boost consumer and its DLQ, and the projection. Each part is red
// where an alert of deploy/prometheus/alerts.yml would fire on what the
// database and Kafka show (Limits), or when it cannot be read.
package status

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/promoflow/promoflow/router/dlqreplay"
	"github.com/promoflow/promoflow/router/rebuild"
)

// Problem is something an alert fires on.
type Problem struct {
	// Alert is the alert of deploy/prometheus/alerts.yml it mirrors; empty
	// for a check that has none.
	Alert  string `json:"alert,omitempty"`
	Detail string `json:"detail"`
}

// Health is one part's verdict.
type Health struct {
	Problems []Problem `json:"problems,omitempty"`
	// Notes are worth a look and fire no alert.
	Notes []string `json:"notes,omitempty"`
	// Error is why the part could not be read; a part unread is red.
	Error string `json:"error,omitempty"`
}

// Red reports whether the part needs someone.
func (h Health) Red() bool { return len(h.Problems) > 0 || h.Error != "" }

func (h *Health) problem(alert, format string, args ...any) {
	h.Problems = append(h.Problems, Problem{Alert: alert, Detail: fmt.Sprintf(format, args...)})
}

func (h *Health) note(format string, args ...any) {
	h.Notes = append(h.Notes, fmt.Sprintf(format, args...))
}

func (h *Health) failed(err error) { h.Error = err.Error() }

// Report is the whole pipeline at one moment.
type Report struct {
	At         time.Time  `json:"at"`
	Expirer    Expirer    `json:"expirer"`
	Outbox     Outbox     `json:"outbox"`
	Consumer   Consumer   `json:"consumer"`
	Projection Projection `json:"projection"`
}

// Healthy reports whether no part is red.
func (r Report) Healthy() bool {
	return !r.Expirer.Red() && !r.Outbox.Red() && !r.Consumer.Red() && !r.Projection.Red()
}

// Reader reads reports.
type Reader struct {
	cfg       Config
	rebuilder *rebuild.Rebuilder
	dlq       *dlqreplay.Replayer
}

// New validates cfg (after defaults) and returns a Reader.
func New(cfg Config) (*Reader, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rb, err := rebuild.New(rebuild.Config{DB: cfg.DB, Kafka: cfg.Kafka, Topic: cfg.Topic, Log: cfg.Log})
	if err != nil {
		return nil, err
	}
	dlq, err := dlqreplay.New(cfg.DeadLetters)
	if err != nil {
		return nil, err
	}
	return &Reader{cfg: cfg, rebuilder: rb, dlq: dlq}, nil
}

// Read reads every part: the database's while Kafka's are read. A part
// that fails to read says why and the others are read all the same.
func (r *Reader) Read(ctx context.Context) Report {
	rep := Report{At: time.Now().UTC()}
	var wg sync.WaitGroup
	wg.Go(func() { rep.Consumer = r.consumer(ctx) })
	rep.Expirer = r.expirer(ctx)
	rep.Outbox = r.outbox(ctx)
	rep.Projection = r.projection(ctx)
	wg.Wait()
	return rep
}

// seconds is d in seconds, as the report's JSON gives every duration.
func seconds(d time.Duration) float64 { return d.Round(time.Millisecond).Seconds() }
