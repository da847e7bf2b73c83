package router

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/promoflow/promoflow/handlers/dberr"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/outbox"
)

// PromotionMetrics are the promotion context's Prometheus series (SPEC §6).
type PromotionMetrics struct {
	RunTotal      prometheus.Counter
	CycleDuration prometheus.Histogram
	Items         *prometheus.CounterVec
	Backlog       prometheus.Gauge
	SkipLocked    prometheus.Counter
	ExpireDelay   prometheus.Histogram
	Errors        *prometheus.CounterVec
	OutboxBacklog prometheus.Gauge
	OutboxLag     prometheus.Gauge
	OutboxRelayed prometheus.Counter
	// OutboxUnreadable counts the relay's attempts at an outbox row it
	// cannot unwrap: it rises each second while the relay is stuck on one.
	OutboxUnreadable prometheus.Counter
	// OutboxSteppedBack is 1 while this process's relay stands back from
	// the outbox position because its last publish failed (outbox.StepBack).
	OutboxSteppedBack prometheus.Gauge
	OutboxStepBacks   prometheus.Counter
	// OutboxHeldBack is how long the oldest outbox writer in progress has
	// held the relay's horizon (0: none holds it).
	OutboxHeldBack prometheus.Gauge
	// OutboxPositionLost counts the pages this process's relay gave up
	// because the session that held its outbox position was lost.
	OutboxPositionLost prometheus.Counter
	// OutboxTopicMissing is 1 while the purchase topic does not exist: the
	// relay publishes nothing (outbox.TopicGuard).
	OutboxTopicMissing prometheus.Gauge
	// OutboxTopicChanged is 1 while the purchase topic has another partition
	// count than pinned, or is not compacted: the relay publishes nothing.
	OutboxTopicChanged prometheus.Gauge
	// OutboxRelayErrors counts the relay's failed outbox queries by reason
	// (read_only, unavailable, other): each is retried a second later.
	OutboxRelayErrors *prometheus.CounterVec
	OutboxCleaned     prometheus.Counter
	// OutboxRebased counts the re-bases of the outbox onto another cluster
	// (a restore, a logical-replication upgrade) seen while this process ran.
	OutboxRebased prometheus.Counter
	KeysCleaned   prometheus.Counter
	// OutboxStandbyHeld is 1 while the standbys of RELAY_STANDBY_FLUSH hold
	// this process's relay back (outbox.StandbyFlush).
	OutboxStandbyHeld prometheus.Gauge
	// OutboxStandbyWait is how long each page waited for the standbys.
	OutboxStandbyWait prometheus.Histogram
}

// NewPromotionMetrics registers the series on reg.
func NewPromotionMetrics(reg prometheus.Registerer) (*PromotionMetrics, error) {
	r := &registry{reg: reg}
	m := &PromotionMetrics{
		RunTotal: r.counter("promotion_expire_run_total", "Expirer cycles run (liveness)."),
		CycleDuration: r.histogram("promotion_expire_cycle_duration_seconds", "Duration of one expirer cycle.",
			.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60),
		Items: r.counterVec("promotion_expire_items_total", "Purchases handled by the expirer, by outcome (expired, poison).",
			"outcome", "expired", "poison"),
		Backlog:    r.gauge("promotion_expire_backlog", "Active purchases past EndsAt left after the last cycle."),
		SkipLocked: r.counter("promotion_expire_skip_locked_total", "Due purchases skipped because another transaction held their row."),
		ExpireDelay: r.histogram("promotion_expire_delay_seconds",
			"AsOf - EndsAt of each expired purchase: how long it stayed Active past its EndsAt.",
			.01, .05, .1, .25, .5, 1, 1.5, 2.5, 5, 10, 30, 60, 120, 300),
		Errors: r.counterVec("promotion_expire_errors_total",
			"Expirer failures, by kind (poison, infrastructure, read_only: the database took no writes, a cycle paused).",
			"kind", "poison", "infrastructure", "read_only"),
		OutboxBacklog: r.gauge("promotion_outbox_backlog", "Outbox events not yet relayed to Kafka."),
		OutboxLag:     r.gauge("promotion_outbox_lag_seconds", "Age of the oldest outbox event not yet relayed."),
		OutboxRelayed: r.counter("promotion_outbox_relayed_total", "Outbox events relayed to Kafka."),
		OutboxUnreadable: r.counter("promotion_outbox_unreadable_rows_total",
			"Relay attempts at an outbox row it cannot unwrap; the relay retries the row each second and relays nothing behind it."),
		OutboxSteppedBack: r.gauge("promotion_outbox_relay_stepped_back",
			"1 while this process's relay stands back from the outbox position because it cannot publish to Kafka."),
		OutboxStepBacks: r.counter("promotion_outbox_relay_step_backs_total",
			"Times this process's relay stepped back from the outbox position after a failed publish."),
		OutboxHeldBack: r.gauge("promotion_outbox_relay_held_back_seconds",
			"How long the oldest outbox writer in progress has held the relay back (0: none does); only a transaction that writes the outbox can."),
		OutboxPositionLost: r.counter("promotion_outbox_relay_position_lost_total",
			"Pages this process's relay gave up unpublished because the database session holding its outbox position was lost."),
		OutboxTopicMissing: r.gauge("promotion_outbox_topic_missing",
			"1 while the purchase topic does not exist: this process's relay publishes nothing and keeps the events in the outbox."),
		OutboxTopicChanged: r.gauge("promotion_outbox_topic_changed",
			"1 while the purchase topic has another partition count than pinned or is not compacted: this process's relay publishes nothing."),
		OutboxRelayErrors: r.counterVec("promotion_outbox_relay_errors_total",
			"Failed outbox queries of the relay, by reason (read_only: the database takes no writes; unavailable; other); each is retried.",
			"reason", dberr.ReasonReadOnly, dberr.ReasonUnavailable, dberr.ReasonOther),
		OutboxCleaned: r.counter("promotion_outbox_cleaned_total", "Relayed outbox rows deleted."),
		OutboxRebased: r.counter("promotion_outbox_rebased_total",
			"Re-bases of the outbox onto another PostgreSQL cluster seen while this process ran: once after a restore or a logical-replication upgrade."),
		KeysCleaned: r.counter("promotion_idempotency_keys_cleaned_total", "Idempotency keys deleted after their retention."),
		OutboxStandbyHeld: r.gauge("promotion_outbox_relay_standby_held",
			"1 while the relay publishes nothing because the standbys of RELAY_STANDBY_FLUSH have not flushed its page."),
		OutboxStandbyWait: r.histogram("promotion_outbox_relay_standby_wait_seconds",
			"How long each outbox page waited for the standbys of RELAY_STANDBY_FLUSH to flush it before it was published.",
			.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5),
	}
	return m, r.err
}

// ObserveCycle records one expirer cycle.
func (m *PromotionMetrics) ObserveCycle(res expire.Result, err error) {
	m.RunTotal.Inc()
	m.CycleDuration.Observe(res.Duration.Seconds())
	m.Items.WithLabelValues("expired").Add(float64(res.ExpiredCount))
	m.Items.WithLabelValues("poison").Add(float64(res.PoisonCount))
	m.Errors.WithLabelValues("poison").Add(float64(res.PoisonCount))
	m.SkipLocked.Add(float64(res.SkippedLockedCount))
	for _, d := range res.Delays {
		m.ExpireDelay.Observe(d.Seconds())
	}
	if dberr.ReadOnly(err) {
		m.Errors.WithLabelValues("read_only").Inc()
		return
	}
	if err != nil {
		m.Errors.WithLabelValues("infrastructure").Inc()
		return
	}
	if !res.Interrupted {
		m.Backlog.Set(float64(res.Backlog))
	}
}

// ObserveOutbox records the relay's backlog.
func (m *PromotionMetrics) ObserveOutbox(s outbox.Stats, cleaned int64) {
	m.OutboxBacklog.Set(float64(s.Backlog))
	m.OutboxLag.Set(s.Lag.Seconds())
	m.OutboxCleaned.Add(float64(cleaned))
}
