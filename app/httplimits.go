package main

import (
	"errors"
	"net"
	"net/http"

	"golang.org/x/net/netutil"

	"github.com/promoflow/promoflow/app/api"
)

// maxHeaderBytes bounds a request's header block. Go's default, 1 MiB, let
// 150 connections each sending a 1 MB header without its final CRLF take a
// process from 28 MB to 419 MB; at 16 KiB the same stays near 32 MB. No
// caller of ours sends more than a few hundred bytes.
const maxHeaderBytes = 16 << 10

// httpLimits bound what callers, authenticated or not, can make one process
// hold at once.
type httpLimits struct {
	// MaxConnections is the most connections the listener holds open; past
	// it, Accept waits and new connections queue in the kernel.
	MaxConnections int
	// MaxInFlight is the most requests served at once; more are answered 503
	// with Retry-After. /healthz and /readyz are not counted.
	MaxInFlight int
}

func (l *httpLimits) register(s *settings) {
	s.int(&l.MaxConnections, "http-max-connections", "HTTP_MAX_CONNECTIONS", 1024,
		"most open connections of the HTTP listener; past it new connections wait to be accepted")
	s.int(&l.MaxInFlight, "http-max-in-flight", "HTTP_MAX_IN_FLIGHT", 256,
		"most HTTP requests served at once; more are answered 503 with Retry-After (/healthz and /readyz are not counted)")
}

func (l httpLimits) validate() error {
	var errs []error
	if l.MaxConnections < 1 {
		errs = append(errs, errors.New("HTTP_MAX_CONNECTIONS (--http-max-connections) must be at least 1"))
	}
	if l.MaxInFlight < 1 {
		errs = append(errs, errors.New("HTTP_MAX_IN_FLIGHT (--http-max-in-flight) must be at least 1"))
	}
	return errors.Join(errs...)
}

// listener caps ln's open connections.
func (l httpLimits) listener(ln net.Listener) net.Listener {
	return netutil.LimitListener(ln, l.MaxConnections)
}

// handler answers 503 with Retry-After to a request that finds MaxInFlight
// others under way, so that a flood queues in no process's memory.
func (l httpLimits) handler(h http.Handler) http.Handler {
	slots := make(chan struct{}, l.MaxInFlight)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
			h.ServeHTTP(w, r)
			return
		}
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
			h.ServeHTTP(w, r)
		default:
			api.WriteOverloaded(w)
		}
	})
}

// rateLimitSettings registers a credential's rate limit as PREFIX_RATE_LIMIT
// and PREFIX_RATE_BURST.
func rateLimitSettings(s *settings, l *api.RateLimit, flagPrefix, envPrefix, who string) {
	s.float(&l.PerSecond, flagPrefix+"-rate-limit", envPrefix+"_RATE_LIMIT", api.RateLimitPerSecondDefault,
		"requests per second "+who+" may make to this process on average; more are answered 429 with Retry-After; 0 turns it off")
	s.int(&l.Burst, flagPrefix+"-rate-burst", envPrefix+"_RATE_BURST", api.RateLimitBurstDefault,
		"requests "+who+" may make to this process at once before the rate limit applies")
}

// validateRateLimit reports a rate limit out of range, naming its variables.
func validateRateLimit(l api.RateLimit, envPrefix string) error {
	var errs []error
	if l.PerSecond < 0 {
		errs = append(errs, errors.New(envPrefix+"_RATE_LIMIT must be 0 (off) or positive"))
	}
	if l.PerSecond > 0 && l.Burst < 1 {
		errs = append(errs, errors.New(envPrefix+"_RATE_BURST must be at least 1"))
	}
	return errors.Join(errs...)
}
