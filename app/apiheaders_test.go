package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestAPI_IncomingBaggageIsNotPublished: a caller's trace headers do not
// reach Kafka as they came. A purchase made with 6 KB of baggage, a
// foreign traceparent and a correlation id that is not valid text is
// published with no baggage, the traceparent of a new trace (whose server
// span links to the caller's), and a correlation id of ours.
func TestAPI_IncomingBaggageIsNotPublished(t *testing.T) {
	t.Parallel()
	rec := recordedSpans()
	dbURL, topic := migratedDatabaseURL(t), "pf-test-"+kafkatest.RandomSuffix()
	kafkatest.CleanupTopic(t, topic)
	promotion := freeAddr(t)
	runInProcess(t, runPromotion, "--database-url", dbURL, "--kafka-brokers", strings.Join(kafkatest.Brokers(t), ","),
		"--http-addr", promotion, "--topic", topic, "--topic-partitions", "1", "--expire-interval", "1h", "--log-level", "warn",
		"--api-tokens", "tenant-one-token-01=0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b")
	waitHTTPReady(t, promotion)

	members := []string{"user.role=admin"}
	for i := range 60 {
		members = append(members, fmt.Sprintf("pad%02d=%s", i, strings.Repeat("x", 90)))
	}
	bag := strings.Join(members, ",")
	require.Greater(t, len(bag), 5000)
	caller := trace.TraceID(uuid.New())
	const invalidCorrelation = "order 42 \xff\xfe"
	req := newPurchaseRequest(t, promotion, uuid.New(), time.Hour)
	req.Header.Set("traceparent", "00-"+caller.String()+"-0102030405060708-01")
	req.Header.Set("baggage", bag)
	req.Header.Set("X-Correlation-Id", invalidCorrelation)
	doCreated(t, req)

	got := kafkatest.ReadTopic(t, topic, 30*time.Second, func(m []*sarama.ConsumerMessage) bool { return len(m) >= 1 })
	record := got[0]
	if b := kafkatest.Header(record, "baggage"); b != "" {
		t.Fatalf("the record carries the caller's baggage: %d bytes, starting %.40q", len(b), b)
	}
	tp := kafkatest.Header(record, "traceparent")
	parts := regexp.MustCompile(`^00-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$`).FindStringSubmatch(tp)
	require.NotNil(t, parts, "the record's traceparent %q", tp)
	require.NotEqual(t, caller.String(), parts[1], "the record continues the caller's trace")
	c := kafkatest.Header(record, event.HeaderCorrelationID)
	require.Regexp(t, `^[A-Za-z0-9._:-]{1,128}$`, c, "the record's correlation id")
	require.NotContains(t, c, "order 42")

	require.Eventually(t, func() bool {
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID().String() == parts[1] && s.SpanKind() == trace.SpanKindServer {
				for _, l := range s.Links() {
					if l.SpanContext.TraceID() == caller {
						return true
					}
				}
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "the new trace's server span links to the caller's")
}
