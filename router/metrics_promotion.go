package router

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

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
	OutboxCleaned prometheus.Counter
	KeysCleaned   prometheus.Counter
}

// NewPromotionMetrics registers the series on reg.
func NewPromotionMetrics(reg prometheus.Registerer) (*PromotionMetrics, error) {
	m := &PromotionMetrics{
		RunTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "promotion_expire_run_total", Help: "Expirer cycles run (liveness)."}),
		CycleDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "promotion_expire_cycle_duration_seconds", Help: "Duration of one expirer cycle.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}),
		Items: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "promotion_expire_items_total", Help: "Purchases handled by the expirer, by outcome (expired, poison)."},
			[]string{"outcome"}),
		Backlog: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "promotion_expire_backlog", Help: "Active purchases past EndsAt left after the last cycle."}),
		SkipLocked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "promotion_expire_skip_locked_total", Help: "Due purchases skipped because another transaction held their row."}),
		ExpireDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "promotion_expire_delay_seconds", Help: "AsOf - EndsAt of each expired purchase: how long it stayed Active past its EndsAt.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 1.5, 2.5, 5, 10, 30, 60, 120, 300}}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "promotion_expire_errors_total", Help: "Expirer failures, by kind (poison, infrastructure)."},
			[]string{"kind"}),
		OutboxBacklog: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "promotion_outbox_backlog", Help: "Outbox events not yet relayed to Kafka."}),
		OutboxLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "promotion_outbox_lag_seconds", Help: "Age of the oldest outbox event not yet relayed."}),
		OutboxRelayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "promotion_outbox_relayed_total", Help: "Outbox events relayed to Kafka."}),
		OutboxCleaned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "promotion_outbox_cleaned_total", Help: "Relayed outbox rows deleted."}),
		KeysCleaned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "promotion_idempotency_keys_cleaned_total", Help: "Idempotency keys deleted after their retention."}),
	}
	m.Items.WithLabelValues("expired")
	m.Items.WithLabelValues("poison")
	m.Errors.WithLabelValues("poison")
	m.Errors.WithLabelValues("infrastructure")
	for _, c := range []prometheus.Collector{m.RunTotal, m.CycleDuration, m.Items, m.Backlog, m.SkipLocked,
		m.ExpireDelay, m.Errors, m.OutboxBacklog, m.OutboxLag, m.OutboxRelayed, m.OutboxCleaned, m.KeysCleaned} {
		if err := reg.Register(c); err != nil {
			return nil, errors.Join(errors.New("register promotion metrics"), err)
		}
	}
	return m, nil
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
