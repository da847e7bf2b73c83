package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestTracing_ProcessesExportEachChangeAsOneTraceToACollector runs the real
// promoflow promotion and catalog processes with OTEL_EXPORTER_OTLP_ENDPOINT
// at an OTLP/HTTP receiver of the test, as a user runs them beside a
// collector. A purchase made with a traceparent and its expiry 3 s later
// arrive as two traces, each whole across both processes: request → create
// transaction → publish, and receive → process → store; cycle → batch →
// publish, and receive → process → store. It logs both trees.
func TestTracing_ProcessesExportEachChangeAsOneTraceToACollector(t *testing.T) {
	t.Parallel()
	collector := startOTLPReceiver(t)
	topic, suffix := "pf-test-"+kafkatest.RandomSuffix(), kafkatest.RandomSuffix()
	for _, tp := range []string{topic, topic + "-replay", topic + "-dlq"} {
		kafkatest.CleanupTopic(t, tp)
	}
	common := []string{"DATABASE_URL=" + migratedDatabaseURL(t), "KAFKA_BROKERS=" + strings.Join(kafkatest.Brokers(t), ","),
		"PROMOTION_TOPIC=" + topic, "KAFKA_TOPIC_PARTITIONS=2", "LOG_LEVEL=warn",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + collector.URL, "OTEL_BSP_SCHEDULE_DELAY=100"}
	promotion, catalog := freeAddr(t), freeAddr(t)
	startCommand(t, envOf(append(common, "HTTP_ADDR="+promotion, "EXPIRE_INTERVAL=1h",
		"PROMOTION_API_TOKENS=tenant-one-token-01=0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b", "API_TRACE_PARENT_TRUSTED=true")...), "promotion").waitReady(t, promotion)
	startCommand(t, envOf(append(common, "HTTP_ADDR="+catalog, "CATALOG_ADMIN_TOKEN="+pooledAdmin,
		"CATALOG_REPLAY_TOPIC="+topic+"-replay", "CATALOG_DLQ_TOPIC="+topic+"-dlq", "CATALOG_CONSUMER_GROUP=pf-test-"+suffix)...),
		"catalog").waitReady(t, catalog)
	project := uuid.New()
	adminCall(t, "PUT", catalog, "/cards/projects/"+project.String(), `{"Title":"Collected"}`, http.StatusOK)

	traceID, callerID := strings.ReplaceAll(uuid.NewString(), "-", ""), "0102030405060708"
	resp, id := postTraced(t, promotion, project, 3*time.Second, "00-"+traceID+"-"+callerID+"-01", "collected-"+suffix)
	require.True(t, strings.HasPrefix(resp.Header.Get("traceresponse"), "00-"+traceID+"-"), resp.Header.Get("traceresponse"))
	waitBoost(t, catalog, "/cards/projects/"+project.String(), 7)
	waitBoost(t, catalog, "/cards/projects/"+project.String(), 0) // expired

	var create, expiry spanTree
	require.Eventually(t, func() bool {
		create = collector.trace(traceID)
		if create.one("catalog.promotion.store") == nil {
			return false
		}
		// The expiry's receive is the one of another trace with this purchase.
		receive, ok := collector.find(func(s treeSpan) bool {
			return s.Name == "catalog.promotion.receive" && s.Attrs["purchase.id"] == id && s.TraceID != traceID
		})
		if !ok {
			return false
		}
		expiry = collector.trace(receive.TraceID)
		return expiry.one("catalog.promotion.store") != nil && expiry.one("promotion.outbox.publish") != nil &&
			expiry.one("promotion.expire.cycle") != nil
	}, 60*time.Second, 50*time.Millisecond, "the collector received both changes' traces; export errors: %v", collector.errors())
	t.Logf("the create, as the collector received it:\n%s", create)
	t.Logf("the expiry, as the collector received it:\n%s", expiry)
	create.requireCreateChain(t, callerID, "collected-"+suffix)
	expiry.requireExpiryChain(t)
	require.Empty(t, collector.errors())
}
