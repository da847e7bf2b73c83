//go:build faults

package faults

import (
	"net/url"
	"strings"

	"github.com/promoflow/promoflow/handlers/nettest"
)

// set is a lookup of names; "*" in names stands for every name.
func set(names []string) map[string]bool {
	out := map[string]bool{}
	for _, n := range names {
		out[n] = true
	}
	return out
}

func (e *env) via(names map[string]bool, process string) bool { return names["*"] || names[process] }

// startProxies starts the proxies the scenario's processes go through: one
// per broker on the stack's proxied listeners (their advertised addresses,
// so that the metadata those processes get names only proxies), one before
// PostgreSQL on a port of its own. db is the scenario's database URL.
func (e *env) startProxies(db *url.URL) {
	t := e.t
	if len(e.kafkaVia) > 0 {
		if len(e.s.routes) == 0 {
			t.Fatal("KAFKA_PROXY_ROUTES is empty: the fault stack needs PROMOFLOW_KAFKA_PROXIED=1 (scripts/faults.sh sets it)")
		}
		for _, r := range e.s.routes {
			p, err := nettest.NewProxy(r.listen, r.upstream)
			must(t, err)
			e.kafkaProxies = append(e.kafkaProxies, p)
		}
	}
	if len(e.pgVia) > 0 {
		p, err := nettest.NewProxy("127.0.0.1:0", db.Host)
		must(t, err)
		e.pgProxy = p
	}
}

// proxies are every proxy of the env.
func (e *env) proxies() []*nettest.Proxy {
	out := append([]*nettest.Proxy{}, e.kafkaProxies...)
	if e.pgProxy != nil {
		out = append(out, e.pgProxy)
	}
	return out
}

// kafkaFor is the bootstrap servers of a process: the proxies or the brokers.
func (e *env) kafkaFor(process string) string {
	if !e.via(e.kafkaVia, process) {
		return e.s.brokers
	}
	addrs := make([]string, len(e.kafkaProxies))
	for i, p := range e.kafkaProxies {
		addrs[i] = p.Addr()
	}
	return strings.Join(addrs, ",")
}

// dbFor is the database URL of a process: through the proxy or straight.
func (e *env) dbFor(process string) string {
	if !e.via(e.pgVia, process) {
		return e.dbURL
	}
	u, err := url.Parse(e.dbURL)
	must(e.t, err)
	u.Host = e.pgProxy.Addr()
	return u.String()
}

// cutKafka opens a black hole in every Kafka proxy; healKafka closes it.
func (e *env) cutKafka() {
	for _, p := range e.kafkaProxies {
		p.BlackHole()
	}
}

func (e *env) healKafka() {
	for _, p := range e.kafkaProxies {
		p.Heal()
	}
}
