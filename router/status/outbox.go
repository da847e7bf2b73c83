package status

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/promoflow/promoflow/handlers/outbox"
)

// Outbox is the relay's part.
type Outbox struct {
	Health
	// Backlog events wait to be relayed; the oldest for OldestAgeSeconds.
	Backlog          int64   `json:"backlog"`
	OldestAgeSeconds float64 `json:"oldestAgeSeconds"`
	// Relay are the relay's sessions in a position transaction, the holder
	// first: none while the relay is idle between polls.
	Relay []RelaySession `json:"relay"`
	// HeldBackBy is the oldest outbox writer in progress, which the relay
	// reads no later transaction past; nil when none runs.
	HeldBackBy *Writer `json:"heldBackBy"`
	// Topic is the purchase topic as the relay judges it (outbox.TopicGuard).
	Topic PurchaseTopic `json:"topic"`
	// Cluster is the PostgreSQL cluster the outbox records, and its xid
	// shift (docs/architecture.md, "The relay across a restore").
	Cluster outbox.Cluster `json:"cluster"`
	lag     time.Duration
}

// PurchaseTopic is the purchase topic as the cluster has it, beside the
// partition count the relay hashes keys over.
type PurchaseTopic struct {
	Name string `json:"name"`
	// Missing is set when the cluster has no such topic.
	Missing       bool   `json:"missing"`
	Partitions    int32  `json:"partitions"`
	CleanupPolicy string `json:"cleanupPolicy"`
	// PinnedPartitions is the count the relay hashes keys over; 0 until a
	// relay has seen the topic.
	PinnedPartitions int32 `json:"pinnedPartitions"`
	// Verdict is why the relay publishes nothing to it; empty when it may.
	Verdict string `json:"verdict,omitempty"`
	verdict error
}

// RelaySession is a database session of a relay.
type RelaySession struct {
	outbox.RelaySession
	SinceSeconds float64 `json:"sinceSeconds"`
}

// Writer is an outbox writer in progress.
type Writer struct {
	outbox.Writer
	AgeSeconds float64 `json:"ageSeconds"`
}

func (r *Reader) outbox(ctx context.Context) (s Outbox) {
	stats, err := outbox.ReadStats(ctx, r.cfg.DB)
	if err != nil {
		s.failed(err)
		return s
	}
	s.Backlog, s.OldestAgeSeconds, s.lag = stats.Backlog, seconds(stats.Lag), stats.Lag
	// A cutover's freeze is planned: a note, not a problem
	// (PromotionDatabaseRefusesWrites pages if it is left for long).
	if f, frozen, err := outbox.ReadFreeze(ctx, r.cfg.DB); err == nil && frozen {
		s.note("writes are frozen since %s (set by %s): the purchase API answers 503 and the expirer pauses; `promoflow outbox thaw` lifts it",
			f.At.UTC().Format(time.RFC3339), f.By)
	}
	sessions, err := outbox.RelaySessions(ctx, r.cfg.DB)
	if err != nil {
		s.failed(err)
		return s
	}
	s.Relay = make([]RelaySession, len(sessions))
	for i, rs := range sessions {
		s.Relay[i] = RelaySession{RelaySession: rs, SinceSeconds: seconds(rs.Since)}
	}
	w, held, err := outbox.OldestWriter(ctx, r.cfg.DB)
	if err != nil {
		s.failed(err)
		return s
	}
	if held {
		s.HeldBackBy = &Writer{Writer: w, AgeSeconds: seconds(w.Age)}
	}
	if s.Cluster, err = outbox.ReadCluster(ctx, r.cfg.DB); err != nil {
		s.failed(err)
		return s
	}
	if s.Topic, err = r.purchaseTopic(ctx); err != nil {
		// Kafka's own health is the consumer part's: the outbox stays readable.
		s.note("purchase topic not read: %v", err)
	}
	s.judge(r.cfg.Limits)
	return s
}

// purchaseTopic reads the purchase topic and its pin, and judges them as
// the relay does.
func (r *Reader) purchaseTopic(ctx context.Context) (PurchaseTopic, error) {
	t := PurchaseTopic{Name: r.cfg.Topic}
	pinned, ok, err := outbox.PinnedPartitions(ctx, r.cfg.DB, r.cfg.Topic)
	if err != nil {
		return t, err
	}
	st, err := r.cfg.Kafka.DescribeTopic(ctx, r.cfg.Topic)
	if err != nil {
		return t, err
	}
	shape := outbox.TopicShape(st)
	t.Missing, t.Partitions, t.CleanupPolicy, t.PinnedPartitions = st.Missing, st.Partitions, strings.Join(st.Policies, ","), pinned
	if !ok && !shape.Missing {
		pinned = shape.Partitions // the first relay to see it pins this count
	}
	if t.verdict = outbox.JudgeTopic(r.cfg.Topic, shape, pinned); t.verdict != nil {
		t.Verdict = t.verdict.Error()
	}
	return t, nil
}

// judge mirrors PromotionOutboxBacklogHigh, PromotionOutboxRelayHeldBack,
// PromotionOutboxTopicMissing and PromotionOutboxTopicChanged, and holds the
// outbox's oldest event to the lag SLO.
func (s *Outbox) judge(l Limits) {
	var changed *outbox.TopicChangedError
	switch {
	case errors.Is(s.Topic.verdict, outbox.ErrTopicMissing):
		s.problem("PromotionOutboxTopicMissing", "purchase topic %s does not exist: the relay publishes nothing until it is created again, compacted, with %d partitions",
			s.Topic.Name, s.Topic.PinnedPartitions)
	case errors.As(s.Topic.verdict, &changed):
		s.problem("PromotionOutboxTopicChanged", "the relay publishes nothing: %s; never add partitions in place: move to a new topic and rebuild the catalog",
			changed.Error())
	}
	if s.Backlog > int64(l.OutboxBacklog) {
		s.problem("PromotionOutboxBacklogHigh", "%d events wait in the outbox (limit %d)", s.Backlog, l.OutboxBacklog)
	}
	if s.lag > l.OutboxLag {
		s.problem("", "the oldest outbox event waits for %s (limit %s): the relay does not drain the outbox",
			s.lag.Round(time.Second), l.OutboxLag)
	}
	if w := s.HeldBackBy; w != nil && w.Age > l.HeldBack {
		s.problem("PromotionOutboxRelayHeldBack", "outbox writer pid %d (application %q, %s) has run for %s (limit %s) and holds every later event back",
			w.PID, w.Application, w.State, w.Age.Round(time.Second), l.HeldBack)
	}
}
