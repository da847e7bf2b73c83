package router

import "github.com/prometheus/client_golang/prometheus"

// NewBuildInfo is promoflow_build_info{version,revision,go_version}, always 1:
// a process's build, joined onto its other series by a query
// (`* on(instance) group_left(version) promoflow_build_info`) and counted
// per version while a release rolls out.
func NewBuildInfo(version, revision, goVersion string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "promoflow_build_info",
		Help:        "The build of this process (always 1): its release, the commit it was built from (unknown without a VCS stamp) and its Go version.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "go_version": goVersion},
	})
	g.Set(1)
	return g
}
