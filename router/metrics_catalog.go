package router

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// CatalogMetrics are the catalog context's Prometheus series (SPEC §6).
type CatalogMetrics struct {
	Lag              prometheus.GaugeFunc
	ConsumeDuration  prometheus.Histogram
	CardsRecomputed  prometheus.Counter
	Stale            prometheus.Counter
	Retries          prometheus.Counter
	DLQ              prometheus.Counter
	ContractMismatch prometheus.Counter
	Consumed         *prometheus.CounterVec
	DedupCleaned     prometheus.Counter
	DriftCards       prometheus.Gauge
	lag              *lagTracker
}

// NewCatalogMetrics registers the series on reg.
func NewCatalogMetrics(reg prometheus.Registerer) (*CatalogMetrics, error) {
	lag := newLagTracker()
	m := &CatalogMetrics{
		lag: lag,
		Lag: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "catalog_promotion_lag_seconds",
			Help: "Age of the oldest event in flight, or of the last one handled in the past 5s; 0 when idle."}, lag.seconds),
		ConsumeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "catalog_promotion_consume_duration_ms", Help: "Time to process one purchase-changed event, in milliseconds.",
			Buckets: []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000}}),
		CardsRecomputed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "catalog_promotion_cards_recomputed_total", Help: "Cards whose PromotionBoost changed."}),
		Stale: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "catalog_promotion_stale_total", Help: "Events skipped by the per-purchase version guard."}),
		Retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "catalog_promotion_retries_total", Help: "Retries of an event after an infrastructure error or a conflict."}),
		DLQ: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "catalog_promotion_dlq_total", Help: "Events sent to pin.catalog.promotion-boost-dlq.v1."}),
		ContractMismatch: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "catalog_promotion_contract_mismatch_total", Help: "Events with an unexpected contract version (processed anyway)."}),
		Consumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "catalog_promotion_consumed_total", Help: "Events consumed, by outcome (applied, stale, duplicate, post_only)."},
			[]string{"outcome"}),
		DedupCleaned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "catalog_promotion_dedup_keys_cleaned_total", Help: "Dedup keys deleted after their retention."}),
		DriftCards: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "catalog_promotion_drift_cards", Help: "Cards whose PromotionBoost differs from the replica's sum at the last audit."}),
	}
	for _, o := range []string{"applied", "stale", "duplicate", "post_only"} {
		m.Consumed.WithLabelValues(o)
	}
	for _, c := range []prometheus.Collector{m.Lag, m.ConsumeDuration, m.CardsRecomputed, m.Stale, m.Retries,
		m.DLQ, m.ContractMismatch, m.Consumed, m.DedupCleaned, m.DriftCards} {
		if err := reg.Register(c); err != nil {
			return nil, errors.Join(errors.New("register catalog metrics"), err)
		}
	}
	return m, nil
}
