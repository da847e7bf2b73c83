package router

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// registry makes series and registers them on reg, keeping every error.
type registry struct {
	reg prometheus.Registerer
	err error
}

func (r *registry) register(c prometheus.Collector, name string) {
	if err := r.reg.Register(c); err != nil {
		r.err = errors.Join(r.err, fmt.Errorf("register %s: %w", name, err))
	}
}

func (r *registry) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	r.register(c, name)
	return c
}

func (r *registry) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	r.register(g, name)
	return g
}

func (r *registry) gaugeFunc(name, help string, f func() float64) prometheus.GaugeFunc {
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	r.register(g, name)
	return g
}

func (r *registry) histogram(name, help string, buckets ...float64) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	r.register(h, name)
	return h
}

// counterVec is a counter by one label, whose values start at 0 so that a
// rate over them exists before the first event.
func (r *registry) counterVec(name, help, label string, values ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
	for _, v := range values {
		c.WithLabelValues(v)
	}
	r.register(c, name)
	return c
}
