package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/promoflow/promoflow/app/api"
)

// readyCheck reports why the process cannot serve yet, or nil. An error that
// wraps a *notReady names the component the public /readyz may show.
type readyCheck func(ctx context.Context) error

// notReady is a readiness failure of one component ("database", "kafka",
// "schema", "router"): the public listener shows the component, and only the
// internal one shows the error's text (hosts, ports, server messages).
type notReady struct {
	Component string
	Err       error
}

func (e *notReady) Error() string { return e.Component + ": " + e.Err.Error() }
func (e *notReady) Unwrap() error { return e.Err }

// componentOf is the component a readiness error names, "internal" when none.
func componentOf(err error) string {
	var nr *notReady
	if errors.As(err, &nr) {
		return nr.Component
	}
	return "internal"
}

// newRegistry is a Prometheus registry with the Go and process collectors
// and promoflow_build_info.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfoMetric())
	return reg
}

// newPublicMux serves /healthz (the process lives) and a /readyz that names
// the component that is not ready, never its error: the API's listener is
// reachable by anyone who reaches the API.
func newPublicMux(ready ...readyCheck) *http.ServeMux {
	mux := http.NewServeMux()
	handleProbes(mux, ready, componentOf)
	return mux
}

// newInternalMux serves /healthz, a /readyz with the error's text and
// /metrics on the internal listener (ADMIN_ADDR), which operators and
// Prometheus reach and the API's clients do not.
func newInternalMux(reg *prometheus.Registry, ready ...readyCheck) *http.ServeMux {
	mux := http.NewServeMux()
	handleProbes(mux, ready, func(err error) string { return err.Error() })
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}

// handleProbes mounts /healthz and /readyz; reason is what /readyz shows of a
// failed check.
func handleProbes(mux *http.ServeMux, ready []readyCheck, reason func(error) string) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(w, `{"status":"ok"}`)
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		for _, check := range ready {
			if err := check(ctx); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "{\"status\":\"unavailable\",\"reason\":%q}\n", reason(err))
				return
			}
		}
		fmt.Fprintln(w, `{"status":"ready"}`)
	})
}

// serveHTTP listens on addr until ctx ends, then drains requests for up to 10s.
// plane names the listener ("public" or "internal") in logs and errors.
// Each API request gets a server span (serverSpans) from what edge keeps of
// its trace headers; limits bound the connections and requests it holds,
// and every request's header.
func serveHTTP(ctx context.Context, plane, addr string, limits httpLimits, edge apiPropagation, h http.Handler, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s (%s listener): %w", addr, plane, err)
	}
	ln = limits.listener(ln)
	srv := &http.Server{Handler: limits.handler(serverSpans(h, edge)), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 30 * time.Second, MaxHeaderBytes: maxHeaderBytes}
	log.Info("http listening", "listener", plane, "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http shutdown: %w", err)
	}
	return nil
}

// listeners serves public on HTTP_ADDR and internal on ADMIN_ADDR, each with
// its own connection and request limits, until ctx ends.
func (c commonConfig) listeners(public, internal *http.ServeMux, log *slog.Logger) []func(context.Context) error {
	return []func(context.Context) error{
		func(ctx context.Context) error {
			return serveHTTP(ctx, "public", c.HTTPAddr, c.HTTPLimits, c.APIEdge, api.JSONErrors(public), log)
		},
		func(ctx context.Context) error {
			return serveHTTP(ctx, "internal", c.AdminAddr, c.HTTPLimits, c.APIEdge, api.JSONErrors(internal), log)
		},
	}
}
