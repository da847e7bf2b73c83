package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// treeSpan is one span of a trace as the tests check it, whether the
// in-memory recorder or an OTLP export gave it.
type treeSpan struct {
	TraceID, SpanID, ParentID string
	Name, Kind, Service       string
	Links                     []string // trace id/span id
	Attrs                     map[string]string
}

// spanTree is the spans of one trace.
type spanTree []treeSpan

func (tr *spanTree) add(s treeSpan) { *tr = append(*tr, s) }

// one is the first span named name, or nil.
func (tr spanTree) one(name string) *treeSpan {
	for i := range tr {
		if tr[i].Name == name {
			return &tr[i]
		}
	}
	return nil
}

// requireOne is the first span named name; the test fails without one.
func (tr spanTree) requireOne(t *testing.T, name string) *treeSpan {
	t.Helper()
	s := tr.one(name)
	require.NotNil(t, s, "no span %s in the trace:\n%s", name, tr)
	return s
}

// requireChild checks that s is a child of parent, of kind, from service
// (when the spans name their services).
func (tr spanTree) requireChild(t *testing.T, s *treeSpan, parent, kind, service string) {
	t.Helper()
	require.Equal(t, parent, s.ParentID, "the parent of %s in:\n%s", s.Name, tr)
	require.Equal(t, kind, s.Kind, "the kind of %s", s.Name)
	if s.Service != "" {
		require.Equal(t, service, s.Service, "the service of %s", s.Name)
	}
}

// requireCreateChain checks a create's trace: the server span (a child of
// the caller's span callerID) → the create transaction → the relay's
// publish, and the consumer's receive → process → store, the receive a
// child of the transaction. It returns the server span.
func (tr spanTree) requireCreateChain(t *testing.T, callerID, correlationID string) *treeSpan {
	t.Helper()
	server := tr.requireOne(t, "POST /promotions")
	tr.requireChild(t, server, callerID, "server", "promoflow-promotion")
	require.Equal(t, "201", server.Attrs["http.response.status_code"])
	require.Equal(t, "/promotions", server.Attrs["http.route"])
	create := tr.requireOne(t, "promotion.purchase.create")
	tr.requireChild(t, create, server.SpanID, "internal", "promoflow-promotion")
	require.Equal(t, correlationID, create.Attrs["correlation_id"])
	publish := tr.requireOne(t, "promotion.outbox.publish")
	tr.requireChild(t, publish, create.SpanID, "producer", "promoflow-promotion")
	tr.requireConsumer(t, create.SpanID, correlationID)
	return server
}

// requireExpiryChain checks an expiry's trace: the cycle (its root) → the
// batch → the relay's publish, and the consumer's receive → process →
// store, the receive a child of the batch.
func (tr spanTree) requireExpiryChain(t *testing.T) {
	t.Helper()
	cycle := tr.requireOne(t, "promotion.expire.cycle")
	tr.requireChild(t, cycle, "", "internal", "promoflow-promotion")
	runID := cycle.Attrs["correlation_id"]
	require.NotEmpty(t, runID)
	batch := tr.requireOne(t, "promotion.expire.batch")
	tr.requireChild(t, batch, cycle.SpanID, "internal", "promoflow-promotion")
	publish := tr.requireOne(t, "promotion.outbox.publish")
	tr.requireChild(t, publish, batch.SpanID, "producer", "promoflow-promotion")
	require.Equal(t, runID, publish.Attrs["correlation_id"], "the publish carries the run id")
	tr.requireConsumer(t, batch.SpanID, runID)
}

// requireConsumer checks receive → process → store below origin.
func (tr spanTree) requireConsumer(t *testing.T, origin, correlationID string) {
	t.Helper()
	receive := tr.requireOne(t, "catalog.promotion.receive")
	tr.requireChild(t, receive, origin, "consumer", "promoflow-catalog")
	require.Equal(t, correlationID, receive.Attrs["correlation_id"])
	process := tr.requireOne(t, "catalog.promotion.process")
	tr.requireChild(t, process, receive.SpanID, "internal", "promoflow-catalog")
	store := tr.requireOne(t, "catalog.promotion.store")
	tr.requireChild(t, store, process.SpanID, "internal", "promoflow-catalog")
}

// String draws the trace as a tree, each span with its ids, links and
// service; a span whose parent is not in the trace (a caller's) is a root.
func (tr spanTree) String() string {
	ids := map[string]bool{}
	for _, s := range tr {
		ids[s.SpanID] = true
	}
	var b strings.Builder
	var draw func(s treeSpan, depth int)
	draw = func(s treeSpan, depth int) {
		fmt.Fprintf(&b, "%s%s [%s] span %s parent %s service %s", strings.Repeat("  ", depth), s.Name, s.Kind,
			s.SpanID, dash(s.ParentID), dash(s.Service))
		if len(s.Links) > 0 {
			fmt.Fprintf(&b, " links %s", strings.Join(s.Links, ","))
		}
		b.WriteString("\n")
		for _, c := range tr {
			if c.ParentID == s.SpanID {
				draw(c, depth+1)
			}
		}
	}
	if len(tr) > 0 {
		fmt.Fprintf(&b, "trace %s\n", tr[0].TraceID)
	}
	for _, s := range tr {
		if !ids[s.ParentID] {
			draw(s, 0)
		}
	}
	return b.String()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
