package main

import (
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/promoflow/promoflow/router"
)

// build is what a binary knows of its own build. Every surface that names
// the build (promoflow version, the start-up log, promoflow_build_info,
// promoflow status) reads it from buildInfo, so they never disagree.
type build struct {
	Version string `json:"version"`
	// Revision is the commit the binary was built from, from Go's VCS stamp;
	// empty when the build has none (go build -buildvcs=false, a build
	// outside a checkout).
	Revision string `json:"revision"`
	// Modified says the checkout had changes the commit does not hold.
	Modified  bool   `json:"modified"`
	GoVersion string `json:"goVersion"`
}

// revisionUnknown stands for the revision of a build without a VCS stamp.
const revisionUnknown = "unknown"

// buildInfo reads this binary's build facts.
func buildInfo() build {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return build{Version: Version, GoVersion: runtime.Version()}
	}
	return buildOf(info)
}

// buildOf is the build that info, a binary's Go build information, records.
func buildOf(info *debug.BuildInfo) build {
	b := build{Version: Version, GoVersion: info.GoVersion}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// revision is the commit, or "unknown" for a build without a VCS stamp.
func (b build) revision() string {
	if b.Revision == "" {
		return revisionUnknown
	}
	return b.Revision
}

// String is the one line of promoflow version, e.g.
// "promoflow 0.2.0 (commit 725fe20a3767, modified) go1.26.0".
func (b build) String() string {
	commit := "commit " + revisionUnknown
	if b.Revision != "" {
		commit = "commit " + b.Revision[:min(12, len(b.Revision))]
	}
	if b.Modified {
		commit += ", modified"
	}
	return fmt.Sprintf("promoflow %s (%s) %s", b.Version, commit, b.GoVersion)
}

// logAttrs are the build's fields of a start-up log record.
func (b build) logAttrs() []any {
	return []any{"version", b.Version, "revision", b.revision(), "modified", b.Modified, "goVersion", b.GoVersion}
}

// logStart writes a process's start-up record: which build is starting.
func logStart(log *slog.Logger) {
	log.Info("starting", buildInfo().logAttrs()...)
}

// buildInfoMetric is promoflow_build_info of this binary.
func buildInfoMetric() prometheus.Collector {
	b := buildInfo()
	return router.NewBuildInfo(b.Version, b.revision(), b.GoVersion)
}

// runVersion prints the build's one line.
func runVersion(w io.Writer) error {
	_, err := fmt.Fprintln(w, buildInfo())
	return err
}
