package main

import (
	"fmt"
	"log/slog"
	"net"
	"strings"

	"github.com/lib/pq"
)

// databaseTLSInsecureOKUsage names the risk taken, not a mode: whoever sets
// it accepts that the connection can be read or altered on its way.
const databaseTLSInsecureOKUsage = "accept a DATABASE_URL whose sslmode does not verify the server's certificate and host name (below verify-full) without the start-up warning: " +
	"named INSECURE_OK because such a connection can be read or altered by anyone on its network path; for a private network you trust"

// databaseTLSRisk is why the connection of dsn to PostgreSQL could be read
// or altered on the network, "" when it verifies the server (verify-full) or
// goes to this machine only (a loopback address or a unix socket). With no
// sslmode lib/pq uses require, which encrypts but accepts any certificate: a
// machine in the middle reads the password and every row.
func databaseTLSRisk(dsn string) string {
	cfg, err := pq.NewConfig(dsn)
	if err != nil {
		return "" // the URL's own error is reported where it is opened
	}
	mode := cfg.SSLMode
	if mode == "" {
		mode = pq.SSLModeRequire
	}
	if mode == pq.SSLModeVerifyFull || onlyLoopback(cfg) {
		return ""
	}
	switch mode {
	case pq.SSLModeDisable, pq.SSLModeAllow, pq.SSLModePrefer:
		return fmt.Sprintf("sslmode=%s: the connection may be unencrypted; anyone on the network path reads the password and every row", mode)
	default:
		return fmt.Sprintf("sslmode=%s does not check the server's host name against its certificate: a machine in the middle can read and alter the connection; use sslmode=verify-full with sslrootcert", mode)
	}
}

// onlyLoopback reports whether every host of cfg is this machine: a loopback
// address (its hostaddr when given), localhost or a unix socket.
func onlyLoopback(cfg pq.Config) bool {
	hosts := []pq.ConfigMultihost{{Host: cfg.Host, Hostaddr: cfg.Hostaddr}}
	hosts = append(hosts, cfg.Multi...)
	for _, h := range hosts {
		switch {
		case h.Hostaddr.IsValid():
			if !h.Hostaddr.IsLoopback() {
				return false
			}
		case h.Host == "" || h.Host == "localhost" || strings.HasPrefix(h.Host, "/") || strings.HasPrefix(h.Host, "@"):
		default:
			if ip := net.ParseIP(strings.Trim(h.Host, "[]")); ip == nil || !ip.IsLoopback() {
				return false
			}
		}
	}
	return true
}

// warnDatabaseTLS logs the risk of the connection's TLS once at start, unless
// the operator accepted it (DATABASE_TLS_INSECURE_OK) or the process is dev.
func warnDatabaseTLS(c commonConfig, log *slog.Logger) {
	if c.dev || c.DatabaseTLSInsecureOK {
		return
	}
	if risk := databaseTLSRisk(c.DatabaseURL); risk != "" {
		log.Warn("database connection is not verified", "risk", risk,
			"fix", "set sslmode=verify-full (and sslrootcert) in DATABASE_URL, or DATABASE_TLS_INSECURE_OK=true on a network you trust")
	}
}
