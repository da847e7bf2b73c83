package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

func TestRun_UnknownCommandIsAClearError(t *testing.T) {
	err := run(context.Background(), []string{"frobnicate"})
	require.ErrorContains(t, err, `unknown command "frobnicate"`)
	require.ErrorContains(t, run(context.Background(), nil), "a command is required")
}

func TestSettings_EnvironmentFillsUnsetFlagsAndBadValuesAreNamed(t *testing.T) {
	t.Setenv("EXPIRE_INTERVAL", "90s")
	t.Setenv("EXPIRE_BATCH_SIZE", "lots")
	var cfg promotionConfig
	s := newSettings("promotion", "")
	cfg.register(s)
	err := s.parse([]string{"--expire-interval", "2m"})
	require.ErrorContains(t, err, `$EXPIRE_BATCH_SIZE="lots"`)
	require.Equal(t, 2*time.Minute, cfg.Expire.Interval, "a flag wins over the environment")

	t.Setenv("EXPIRE_BATCH_SIZE", "50")
	cfg = promotionConfig{}
	s = newSettings("promotion", "")
	cfg.register(s)
	require.NoError(t, s.parse(nil))
	require.Equal(t, 90*time.Second, cfg.Expire.Interval)
	require.Equal(t, 50, cfg.Expire.BatchSize)
}

func TestPromotionCommand_RejectsMissingAndBadSettings(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("KAFKA_BROKERS", "")
	err := runPromotion(context.Background(), []string{"--api-tokens", "nope"})
	require.ErrorContains(t, err, "database URL is required")
	require.ErrorContains(t, err, "kafka brokers are required")
	require.ErrorContains(t, err, "want token=tenant-uuid")
}

func TestPromotionCommand_HelpListsEverySettingWithItsVariable(t *testing.T) {
	var cfg promotionConfig
	s := newSettings("promotion", "")
	cfg.register(s)
	var out bytes.Buffer
	s.fs.SetOutput(&out)
	s.fs.Usage()
	for _, env := range []string{"DATABASE_URL", "KAFKA_BROKERS", "EXPIRE_INTERVAL", "EXPIRE_BATCH_SIZE", "EXPIRE_WAKEUP", "EXPIRE_WAKEUP_POLL", "PROMOTION_API_TOKENS"} {
		require.Contains(t, out.String(), "$"+env)
	}
}

// TestPromotionCommand_PurchaseAppearsOnKafkaAsActiveThenExpired runs the
// promotion process against the real stack: a purchase made through the API
// with EndsAt two seconds ahead reaches the topic as Active, then as Expired.
func TestPromotionCommand_PurchaseAppearsOnKafkaAsActiveThenExpired(t *testing.T) {
	t.Parallel()
	dbURL := migratedDatabaseURL(t)
	topic := "pf-test-" + kafkatest.RandomSuffix()
	addr, admin := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runPromotion(ctx, []string{"--database-url", dbURL, "--kafka-brokers", strings.Join(kafkatest.Brokers(t), ","),
			"--http-addr", addr, "--admin-addr", admin, "--topic", topic, "--topic-partitions", "2", "--expire-interval", "500ms",
			"--api-tokens", "tenant-one-token-01=0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b", "--log-level", "warn"})
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done, "graceful stop")
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond)

	body, _ := json.Marshal(map[string]any{"PackageKind": "Top", "BoostWeight": 5,
		"Targets": []map[string]string{{"TargetKind": "Project", "TargetId": "11111111-2222-4333-8444-555555555555"}},
		"EndsAt":  time.Now().Add(2 * time.Second).UTC().Format(time.RFC3339Nano)})
	req, _ := http.NewRequest("POST", "http://"+addr+"/promotions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer tenant-one-token-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	var created struct{ Id string }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&created))
	resp.Body.Close()

	msgs := kafkatest.ReadTopic(t, topic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 2 })
	var statuses []event.Status
	for _, m := range msgs {
		require.Equal(t, created.Id, string(m.Key))
		ev, err := event.Parse(m.Value)
		require.NoError(t, err)
		statuses = append(statuses, ev.Status)
	}
	require.Equal(t, []event.Status{event.StatusActive, event.StatusExpired}, statuses)

	metrics, err := http.Get("http://" + admin + "/metrics")
	require.NoError(t, err)
	defer metrics.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(metrics.Body)
	for _, name := range []string{"promotion_expire_run_total", "promotion_expire_cycle_duration_seconds", "promotion_expire_items_total",
		"promotion_expire_backlog", "promotion_expire_skip_locked_total", "promotion_expire_errors_total",
		"promotion_outbox_backlog", "promotion_outbox_lag_seconds"} {
		require.Contains(t, buf.String(), name)
	}
}

// freeAddr is a loopback address nothing listens on now. The kernel may hand
// a port it just gave back out again, so that two calls
// (a process's public and internal listeners) would name one port: a port
// this test run handed out before is never handed out again.
func freeAddr(t *testing.T) string {
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if _, seen := handedOut.LoadOrStore(port, true); !seen {
			return fmt.Sprintf("127.0.0.1:%d", port)
		}
	}
}

// handedOut are the ports freeAddr returned in this test run.
var handedOut sync.Map

// TestPromotionSettings_RelayTransactionalIDIsOffUnlessSet: unset or "off",
// the relay's producer is not transactional; any other value is the id.
func TestPromotionSettings_RelayTransactionalIDIsOffUnlessSet(t *testing.T) {
	t.Setenv("PROMOTION_TOPIC", "pin.test.purchases")
	parse := func(args ...string) string {
		t.Helper()
		var cfg promotionConfig
		s := newSettings("promotion", "")
		cfg.register(s)
		require.NoError(t, s.parse(args))
		cfg.wire()
		return cfg.Relay.RelayProducerTransactionalID()
	}
	require.Empty(t, parse(), "unset: no transactions")
	require.Empty(t, parse("--relay-transactional-id", "off"), "off: no transactions")
	t.Setenv("RELAY_TRANSACTIONAL_ID", "relay.eu-1")
	require.Equal(t, "relay.eu-1", parse(), "any other value is the id")
}
