package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/handlers/purchase/purchasetest"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// TestOutbox_DrainFreezesWritesUntilThawed: `promoflow outbox drain` beside a
// running promotion process waits for an outbox writer that began before the
// freeze, and exits 0 once the relay has published the whole outbox, that
// writer's event included; while the freeze stands the purchase API answers create and cancel
// with 503 and Retry-After and the expirer expires nothing, however many
// cycles run; `promoflow outbox thaw` lifts it, and both write again.
func TestOutbox_DrainFreezesWritesUntilThawed(t *testing.T) {
	t.Parallel()
	url := migratedDatabaseURL(t)
	topic := "pf-test-" + kafkatest.RandomSuffix()
	kafkatest.CleanupTopic(t, topic)
	env := envOf("DATABASE_URL="+url, "KAFKA_BROKERS="+strings.Join(kafkatest.Brokers(t), ","))
	addr := freeAddr(t)
	proc := startCommand(t, with(env, "HTTP_ADDR", addr, "PROMOTION_TOPIC", topic, "KAFKA_TOPIC_PARTITIONS", "1",
		"EXPIRE_INTERVAL", "200ms", "PROMOTION_API_TOKENS", "tenant-one-token-01=0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b"), "promotion")
	proc.waitReady(t, addr)
	db := pgtest.OpenAsIs(t, url)
	var active []uuid.UUID
	for range 5 {
		active = append(active, createPurchase(t, addr, "tenant-one-token-01", time.Hour))
	}

	// A writer that began before the freeze: drain waits for it, and then
	// for the relay to publish what it wrote.
	ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetProject, uuid.New()))
	msg, err := event.NewMessage(ev, "drain-test", time.Now())
	require.NoError(t, err)
	writer, err := outbox.BeginTx(t.Context(), db, nil)
	require.NoError(t, err)
	defer writer.Rollback() //nolint:errcheck // no-op after commit
	require.NoError(t, outbox.PublishTx(writer, topic, msg))
	drain := startCommand(t, env, "outbox", "drain")
	require.Eventually(t, func() bool { return strings.Contains(drain.output(), "write freeze set at") },
		30*time.Second, 20*time.Millisecond, "drain sets the freeze; output:\n%s", drain)
	_, ended := drain.wait(time.Second)
	require.False(t, ended, "drain ended while a writer that began before the freeze runs:\n%s", drain)
	require.NoError(t, writer.Commit())
	code := drain.exitCode(t, time.Minute)
	out := drain.output()
	t.Logf("drain printed:\n%s", out)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "outbox empty:")
	kafkatest.ReadTopic(t, topic, 10*time.Second, func(got []*sarama.ConsumerMessage) bool { return hasKey(got, ev.PurchaseId.String()) })
	st, err := outbox.ReadStats(t.Context(), db)
	require.NoError(t, err)
	require.Zero(t, st.Backlog, "events left in the outbox after drain")

	created, err := postPurchase(addr, "tenant-one-token-01", uuid.New(), 5, time.Hour)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, created.Status, created.Body)
	require.NotEmpty(t, created.RetryAfter)
	require.Contains(t, created.Body, `"code":"read_only"`)
	cancelled := cancelPurchase(t, addr, "tenant-one-token-01", active[0])
	require.Equal(t, http.StatusServiceUnavailable, cancelled.StatusCode)
	require.NotEmpty(t, cancelled.Header.Get("Retry-After"))

	_, status := runCommand(t, with(env, "PROMOTION_TOPIC", topic), time.Minute, "status")
	require.Contains(t, status, "writes are frozen since", "promoflow status names the freeze")

	due := purchasetest.SeedActive(t, db, 3, time.Now().Add(-time.Minute))
	paused := metricValue(t, addr, `promotion_expire_errors_total{kind="read_only"}`)
	require.Eventually(t, func() bool {
		return metricValue(t, addr, `promotion_expire_errors_total{kind="read_only"}`) >= paused+3
	}, 30*time.Second, 50*time.Millisecond, "the expirer's cycles meet the freeze")
	for _, id := range append(due, active...) {
		require.Equal(t, event.StatusActive, purchasetest.Statuses(t, db)[id].Status, "%s changed under the freeze", id)
	}
	st, err = outbox.ReadStats(t.Context(), db)
	require.NoError(t, err)
	require.Zero(t, st.Backlog, "an outbox event written under the freeze")

	code, out = runCommand(t, env, time.Minute, "outbox", "thaw")
	t.Logf("thaw printed:\n%s", out)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "write freeze lifted")
	createPurchase(t, addr, "tenant-one-token-01", time.Hour)
	require.Equal(t, http.StatusOK, cancelPurchase(t, addr, "tenant-one-token-01", active[0]).StatusCode)
	require.Eventually(t, func() bool {
		states := purchasetest.Statuses(t, db)
		for _, id := range due {
			if states[id].Status != event.StatusExpired {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "the expirer expires the due purchases after the thaw")
	out = proc.output()
	require.NotContains(t, out, `"level":"ERROR"`, "a freeze pauses the expirer; it is not an error")
	require.Equal(t, 1, strings.Count(out, "the database takes no writes: expirer paused"), out)

	help := runCommandToEnd(t, env, 30*time.Second, "outbox", "drain", "--help")
	require.Equal(t, 0, help.cmd.ProcessState.ExitCode())
	require.Contains(t, help.stdout.String(), "Usage: promoflow outbox drain")
	code, out = runCommand(t, env, 30*time.Second, "outbox", "freeze")
	require.Equal(t, 1, code)
	require.Contains(t, out, "promoflow: outbox: name drain or thaw")
}

// cancelPurchase asks the purchase API at addr to cancel id.
func cancelPurchase(t *testing.T, addr, token string, id uuid.UUID) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", "http://"+addr+"/promotions/"+id.String()+"/cancel", bytes.NewReader(nil))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	return resp
}
