package router

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/promoflow/promoflow/middleware"
)

// stuckCollector exports catalog_promotion_partition_stuck_seconds: for each
// partition whose consumer keeps failing on a record, how long it has failed
// (middleware.Stuck), read at each scrape so that a partition that moved on
// drops out.
type stuckCollector struct {
	stuck *middleware.Stuck
	desc  *prometheus.Desc
}

func newStuckCollector(stuck *middleware.Stuck) stuckCollector {
	return stuckCollector{stuck: stuck, desc: prometheus.NewDesc("catalog_promotion_partition_stuck_seconds",
		"How long the consumer has kept failing on the record that holds the partition's position (its lowest failing offset); "+
			"absent when none fails. CatalogPartitionStuck fires past 2 minutes.", []string{"topic", "partition"}, nil)}
}

func (c stuckCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c stuckCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, p := range c.stuck.Partitions(now) {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, now.Sub(p.Since).Seconds(),
			p.Topic, strconv.Itoa(int(p.Partition)))
	}
}
