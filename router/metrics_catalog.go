package router

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/promoflow/promoflow/middleware"
)

// CatalogMetrics are the catalog context's Prometheus series (SPEC §6).
type CatalogMetrics struct {
	Lag prometheus.GaugeFunc
	// ConsumeDuration is the seed's catalog_promotion_consume_duration_ms,
	// kept under the name the seed gives it; ConsumeSeconds is the same time
	// in seconds, as Prometheus names units, for dashboards and alerts.
	ConsumeDuration prometheus.Histogram
	ConsumeSeconds  prometheus.Histogram
	BatchSize       prometheus.Histogram
	CardsRecomputed prometheus.Counter
	Stale           prometheus.Counter
	// MessageIDReused counts the events applied whose MessageId came
	// before with another payload (middleware.DedupConfig.OnReused).
	MessageIDReused  prometheus.Counter
	Retries          prometheus.Counter
	DLQ              prometheus.Counter
	ContractMismatch prometheus.Counter
	Consumed         *prometheus.CounterVec
	DedupCleaned     prometheus.Counter
	DriftCards       prometheus.Gauge
	// GroupSessions counts the consumer-group sessions on the purchase
	// topic this process started: one at its first join, one per rebalance.
	GroupSessions prometheus.Counter
	// ReadAheadBytes is what the consumer has fetched and not yet handled,
	// as its read-ahead counts it (ConsumerBuffers.ReadAheadBytes).
	ReadAheadBytes prometheus.Gauge
	// Stuck tracks the record each partition keeps failing on
	// (catalog_promotion_partition_stuck_seconds).
	Stuck *middleware.Stuck
	// lag feeds Lag; its middleware goes outermost in the consumer chain.
	lag *middleware.Lag
}

// Outcomes of catalog_promotion_consumed_total.
const (
	outcomeApplied   = "applied"
	outcomeStale     = "stale"
	outcomeDuplicate = "duplicate"
	outcomePostOnly  = "post_only"
	outcomeTombstone = "tombstone"
)

// NewCatalogMetrics registers the series on reg.
func NewCatalogMetrics(reg prometheus.Registerer) (*CatalogMetrics, error) {
	r := &registry{reg: reg}
	lag := middleware.NewLag()
	m := &CatalogMetrics{
		lag: lag,
		Lag: r.gaugeFunc("catalog_promotion_lag_seconds",
			"Age of the oldest event in flight, or of the last one handled in the past 5s; 0 when idle.", lag.Seconds),
		ConsumeDuration: r.histogram("catalog_promotion_consume_duration_ms",
			"Time to process one purchase-changed event, in milliseconds (the seed's name; see _seconds).", 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000),
		ConsumeSeconds: r.histogram("catalog_promotion_consume_duration_seconds",
			"Time to process one purchase-changed event, in seconds.", 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
		BatchSize: r.histogram("catalog_promotion_batch_size",
			"Events per consumer transaction (the group commit).", 1, 2, 4, 8, 16, 32, 64, 128),
		CardsRecomputed: r.counter("catalog_promotion_cards_recomputed_total", "Cards whose PromotionBoost changed."),
		Stale:           r.counter("catalog_promotion_stale_total", "Events skipped by the per-purchase version guard."),
		MessageIDReused: r.counter("catalog_promotion_message_id_reused_total",
			"Events whose MessageId came before with another payload: applied as new records (the version guard decides)."),
		Retries:          r.counter("catalog_promotion_retries_total", "Retries of an event after an infrastructure error or a conflict."),
		DLQ:              r.counter("catalog_promotion_dlq_total", "Events sent to pin.catalog.promotion-boost-dlq.v1."),
		ContractMismatch: r.counter("catalog_promotion_contract_mismatch_total", "Events with an unexpected contract version (processed anyway)."),
		Consumed: r.counterVec("catalog_promotion_consumed_total", "Events consumed, by outcome (applied, stale, duplicate, post_only, tombstone).",
			"outcome", outcomeApplied, outcomeStale, outcomeDuplicate, outcomePostOnly, outcomeTombstone),
		DedupCleaned: r.counter("catalog_promotion_dedup_keys_cleaned_total", "Dedup marks, and dedup keys of the previous format, deleted after their retention."),
		DriftCards:   r.gauge("catalog_promotion_drift_cards", "Cards whose PromotionBoost differs from the replica's sum at the last audit."),
		GroupSessions: r.counter("catalog_promotion_group_sessions_total",
			"Consumer-group sessions on the purchase topic this process started: one at its first join, one per rebalance."),
		ReadAheadBytes: r.gauge("catalog_promotion_read_ahead_bytes",
			"Bytes of records fetched and not yet handled, counted as the read-ahead budget counts them (key, value, headers and 1 KiB each)."),
		Stuck: middleware.NewStuck(0),
	}
	r.register(newStuckCollector(m.Stuck), "catalog_promotion_partition_stuck_seconds")
	return m, r.err
}
