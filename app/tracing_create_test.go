package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// recordedSpans is the span recorder of the processes a test runs inside the
// test binary; the first call makes it the global provider's, with the
// default propagators (a process sets them at its start).
var recordedSpans = sync.OnceValue(func() *tracetest.SpanRecorder {
	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	otel.SetTextMapPropagator(propagatorFromEnv(""))
	return rec
})

// TestTracing_CreateToCardIsOneTrace: a purchase made through the API with a
// trusted caller's traceparent is one trace from the request to the card, through real
// PostgreSQL and Kafka: the API's server span (a child of the caller's
// span, named in the answer's traceresponse) → the create transaction → the
// relay's publish, and, from the Kafka headers, the consumer's receive →
// process → store, whose transaction continues or links to it.
func TestTracing_CreateToCardIsOneTrace(t *testing.T) {
	t.Parallel()
	rec := recordedSpans()
	dbURL, topic, suffix := migratedDatabaseURL(t), "pf-test-"+kafkatest.RandomSuffix(), kafkatest.RandomSuffix()
	for _, tp := range []string{topic, topic + "-replay", topic + "-dlq"} {
		kafkatest.CleanupTopic(t, tp)
	}
	brokers := strings.Join(kafkatest.Brokers(t), ",")
	promotion, catalog := freeAddr(t), freeAddr(t)
	runInProcess(t, runPromotion, "--database-url", dbURL, "--kafka-brokers", brokers, "--http-addr", promotion,
		"--topic", topic, "--topic-partitions", "2", "--expire-interval", "1h", "--log-level", "warn",
		"--api-tokens", "tenant-one-token-01=0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b", "--api-trace-parent-trusted")
	waitHTTPReady(t, promotion)
	runInProcess(t, runCatalog, "--database-url", dbURL, "--kafka-brokers", brokers, "--http-addr", catalog,
		"--topic", topic, "--replay-topic", topic+"-replay", "--dlq-topic", topic+"-dlq", "--topic-partitions", "2",
		"--consumer-group", "pf-test-"+suffix, "--admin-token", pooledAdmin, "--log-level", "warn")
	waitHTTPReady(t, catalog)
	project := uuid.New()
	adminCall(t, "PUT", catalog, "/cards/projects/"+project.String(), `{"Title":"Traced"}`, http.StatusOK)

	caller := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID(uuid.New()),
		SpanID: trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled})
	resp, _ := postTraced(t, promotion, project, time.Hour, "00-"+caller.TraceID().String()+"-"+caller.SpanID().String()+"-01",
		"create-"+suffix)
	waitBoost(t, catalog, "/cards/projects/"+project.String(), 7)

	tree := spanTree{}
	require.Eventually(t, func() bool {
		tree = spanTree{}
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID() == caller.TraceID() {
				tree.add(recordedSpan(s))
			}
		}
		return tree.one("catalog.promotion.store") != nil && tree.one("promotion.outbox.publish") != nil
	}, 30*time.Second, 20*time.Millisecond, "the trace of the request reaches the consumer's store span")
	server := tree.requireCreateChain(t, caller.SpanID().String(), "create-"+suffix)
	require.Equal(t, "00-"+caller.TraceID().String()+"-"+server.SpanID+"-01", resp.Header.Get("traceresponse"),
		"the answer names its trace and the server span")
}

// postTraced makes a purchase of weight 7 on project through the API at addr,
// ending after lasts, with traceparent and correlationID; it wants a 201.
func postTraced(t *testing.T, addr string, project uuid.UUID, lasts time.Duration, traceparent, correlationID string) (*http.Response, string) {
	t.Helper()
	req := newPurchaseRequest(t, addr, project, lasts)
	req.Header.Set("traceparent", traceparent)
	req.Header.Set("X-Correlation-Id", correlationID)
	return doCreated(t, req)
}

// newPurchaseRequest is the request of tenant t1 for a purchase of weight 7
// on project through the API at addr, ending after lasts.
func newPurchaseRequest(t *testing.T, addr string, project uuid.UUID, lasts time.Duration) *http.Request {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"PackageKind": "Top", "BoostWeight": 7,
		"Targets": []map[string]string{{"TargetKind": "Project", "TargetId": project.String()}},
		"EndsAt":  time.Now().Add(lasts).UTC().Format(time.RFC3339Nano)})
	req, err := http.NewRequest("POST", "http://"+addr+"/promotions", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer tenant-one-token-01")
	return req
}

// doCreated sends a purchase request, wants a 201 and returns the purchase's id.
func doCreated(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	var created struct{ Id string }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&created))
	return resp, created.Id
}

// runInProcess runs a promoflow command inside the test binary until the test ends.
func runInProcess(t *testing.T, run func(context.Context, []string) error, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, args) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done, "graceful stop")
	})
}

// waitHTTPReady waits until the process at addr answers /readyz with 200.
func waitHTTPReady(t *testing.T, addr string) {
	t.Helper()
	require.Eventually(t, func() bool { return readyz(addr) == http.StatusOK }, 60*time.Second, 50*time.Millisecond,
		"not ready at %s", addr)
}

// recordedSpan is a span of the in-memory recorder as a treeSpan.
func recordedSpan(s sdktrace.ReadOnlySpan) treeSpan {
	out := treeSpan{TraceID: s.SpanContext().TraceID().String(), SpanID: s.SpanContext().SpanID().String(),
		Name: s.Name(), Kind: s.SpanKind().String(), Attrs: map[string]string{}}
	if s.Parent().IsValid() {
		out.ParentID = s.Parent().SpanID().String()
	}
	for _, l := range s.Links() {
		out.Links = append(out.Links, l.SpanContext.TraceID().String()+"/"+l.SpanContext.SpanID().String())
	}
	for _, a := range s.Attributes() {
		out.Attrs[string(a.Key)] = a.Value.Emit()
	}
	return out
}
