package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/router/status"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// statusStack is a promotion and a catalog process on a database and topics
// of their own, and the settings `promoflow status` reads them with.
type statusStack struct {
	db         *sqlx.DB
	env        map[string]string
	promoAddr  string
	catalog    *command
	catalogAt  string
	topic, dlq string
}

const statusToken = "status-tenant-token"

func newStatusStack(t *testing.T) *statusStack {
	t.Helper()
	url := pgtest.DatabaseURL(t)
	st := &statusStack{db: pgtest.Open(t, url), promoAddr: freeAddr(t), catalogAt: freeAddr(t),
		topic: kafkatest.TopicWith(t, kafkakit.Topic{Partitions: 3, CleanupPolicy: kafkakit.PolicyCompact}),
		dlq:   kafkatest.Topic(t, 1)}
	st.env = envOf("DATABASE_URL="+url, "KAFKA_BROKERS="+strings.Join(kafkatest.Brokers(t), ","), "LOG_LEVEL=warn",
		"PROMOTION_TOPIC="+st.topic, "CATALOG_DLQ_TOPIC="+st.dlq, "CATALOG_REPLAY_TOPIC="+kafkatest.Topic(t, 1),
		"CATALOG_CONSUMER_GROUP=pf-test-status-"+kafkatest.RandomSuffix(), "KAFKA_CREATE_TOPICS=false")
	promotion := startCommand(t, with(st.env, "HTTP_ADDR", st.promoAddr, "EXPIRE_INTERVAL", "2s",
		"PROMOTION_API_TOKENS", statusToken+"=0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b"), "promotion")
	promotion.waitReady(t, st.promoAddr)
	st.catalog = startCommand(t, with(st.env, "HTTP_ADDR", st.catalogAt, "CATALOG_AUDIT_INTERVAL", "1s",
		"CATALOG_RETRY_INITIAL", "10ms", "CATALOG_RETRY_MAX", "100ms"), "catalog")
	st.catalog.waitReady(t, st.catalogAt)
	return st
}

// statusLimits are the alerts' limits scaled down to a test's seconds.
var statusLimits = []string{"--lag-max=2s", "--held-back-max=2s", "--outbox-lag-max=3s", "--dead-letter-window=5m"}

// status runs `promoflow status --json` and returns its exit status and
// report; ok is false when it printed none.
func (st *statusStack) status(t *testing.T) (code int, rep status.Report, ok bool) {
	t.Helper()
	c := runCommandToEnd(t, st.env, time.Minute, append([]string{"status", "--json"}, statusLimits...)...)
	if err := json.Unmarshal([]byte(c.stdout.String()), &rep); err != nil {
		t.Logf("no report (%v): %s", err, c.output())
		return 0, rep, false
	}
	return c.cmd.ProcessState.ExitCode(), rep, true
}

// waitStatus waits until the status exits with code, logs its screen, and
// returns the report.
func (st *statusStack) waitStatus(t *testing.T, code int) status.Report {
	t.Helper()
	return st.waitStatusWhere(t, code, func(status.Report) bool { return true })
}

// waitStatusWhere waits until the status exits with code and its report
// satisfies done (a state the consumer reaches record by record).
func (st *statusStack) waitStatusWhere(t *testing.T, code int, done func(status.Report) bool) status.Report {
	t.Helper()
	var (
		last int
		rep  status.Report
	)
	if !assert.Eventually(t, func() bool {
		var ok bool
		last, rep, ok = st.status(t)
		return ok && last == code && done(rep)
	}, 90*time.Second, 500*time.Millisecond) {
		report, _ := json.MarshalIndent(rep, "", "  ")
		t.Fatalf("promoflow status exits %d, want %d; its report:\n%s", last, code, report)
	}
	screenCode, screen := runCommand(t, st.env, time.Minute, append([]string{"status"}, statusLimits...)...)
	t.Logf("promoflow status (exit %d):\n%s", screenCode, screen)
	return rep
}

func (st *statusStack) purchase(t *testing.T) uuid.UUID {
	t.Helper()
	return createPurchase(t, st.promoAddr, statusToken, time.Hour)
}

func alerts(h status.Health) []string {
	var out []string
	for _, p := range h.Problems {
		out = append(out, p.Alert)
	}
	return out
}

// TestStatus_IsHealthyOnAHealthyStackAndNamesEachRedPartInItsExitStatus runs
// promoflow status against a running promotion and catalog process, then
// puts the pipeline in each red state an alert fires on and back: drift
// (32), an outbox writer held open (8), a stopped consumer (16), a DLQ that
// fills (16).
func TestStatus_IsHealthyOnAHealthyStackAndNamesEachRedPartInItsExitStatus(t *testing.T) {
	t.Parallel()
	st := newStatusStack(t)
	ctx := context.Background()
	st.purchase(t)

	t.Run("healthy", func(t *testing.T) {
		rep := st.waitStatus(t, 0)
		require.NotNil(t, rep.Expirer.LastCycle, "the expirer's last cycle is recorded")
		require.Equal(t, 2.0, rep.Expirer.LastCycle.IntervalSeconds)
		require.NotEmpty(t, rep.Consumer.Members, "the catalog is a member of the group")
		require.Equal(t, 3, rep.Consumer.Partitions)
		require.NotNil(t, rep.Projection.CardCheck, "the catalog's card check is recorded")
		require.Equal(t, "catalog", rep.Projection.CardCheck.Source)
	})

	t.Run("drift", func(t *testing.T) {
		card := uuid.New()
		tx := st.db.MustBegin()
		require.NoError(t, boost.UpsertProjectCardTx(ctx, tx, boost.ProjectCard{ID: card, Status: "Published", Visibility: "Visible"}))
		require.NoError(t, tx.Commit())
		st.db.MustExec(`UPDATE catalog.project_cards SET promotion_boost = 7 WHERE id = $1`, card)
		rep := st.waitStatus(t, exitProjectionRed)
		require.Equal(t, []string{"CatalogPromotionDrift"}, alerts(rep.Projection.Health))
		require.Equal(t, 1, rep.Projection.CardCheck.Drifted)
		require.Equal(t, card, rep.Projection.CardCheck.Samples[0].ID)

		code, out := runCommand(t, st.env, time.Minute, "audit", "--repair")
		require.Equal(t, 0, code, out)
		st.waitStatus(t, 0)
	})

	t.Run("stuck relay", func(t *testing.T) {
		writer := st.db.MustBegin()
		defer writer.Rollback()
		writer.MustExec(`SELECT promotion.outbox_writer_lock()`)
		writer.MustExec(`SELECT pg_current_xact_id()`)
		pid := pgtest.BackendPid(t, writer)
		st.purchase(t) // written behind the held writer: the relay may not read it
		rep := st.waitStatus(t, exitOutboxRed)
		require.Contains(t, alerts(rep.Outbox.Health), "PromotionOutboxRelayHeldBack")
		require.NotNil(t, rep.Outbox.HeldBackBy)
		require.Equal(t, pid, rep.Outbox.HeldBackBy.PID)
		require.EqualValues(t, 1, rep.Outbox.Backlog)

		require.NoError(t, writer.Rollback())
		st.waitStatus(t, 0)
	})

	t.Run("stopped consumer", func(t *testing.T) {
		require.Eventually(t, func() bool {
			_, rep, ok := st.status(t)
			return ok && rep.Consumer.Error == "" && rep.Consumer.SumLag == 0
		}, time.Minute, 500*time.Millisecond, "the group committed every record")
		st.catalog.signal(t, syscall.SIGSTOP)
		defer st.catalog.signal(t, syscall.SIGCONT)
		st.purchase(t)
		rep := st.waitStatus(t, exitConsumerRed)
		require.Equal(t, []string{"CatalogPromotionLagHigh"}, alerts(rep.Consumer.Health))
		require.Len(t, rep.Consumer.Behind, 1)
		require.EqualValues(t, 1, rep.Consumer.SumLag)
		require.Greater(t, rep.Consumer.MaxLagSeconds, 2.0)

		st.catalog.signal(t, syscall.SIGCONT)
		st.waitStatus(t, 0)
	})

	t.Run("full DLQ", func(t *testing.T) {
		produceBroken(t, st.topic, 5)
		rep := st.waitStatusWhere(t, exitConsumerRed, func(rep status.Report) bool {
			// dead-lettered one by one, and the lag they caused gone
			return rep.Consumer.DeadLetters != nil && rep.Consumer.DeadLetters.Records == 5 &&
				slices.Equal(alerts(rep.Consumer.Health), []string{"CatalogPromotionDeadLetters"})
		})
		require.Equal(t, []string{"CatalogPromotionDeadLetters"}, alerts(rep.Consumer.Health))
		require.EqualValues(t, 5, rep.Consumer.DeadLetters.Records)
		require.Equal(t, "contract_violation", rep.Consumer.DeadLetters.Rows[0].Code)
	})
}

// syncProducer is a plain producer of the test's, closed when the test ends.
func syncProducer(t *testing.T, clientID string) sarama.SyncProducer {
	t.Helper()
	cfg := kafkatest.Cluster(t).ClientConfig(clientID)
	cfg.Producer.Return.Successes = true
	producer, err := sarama.NewSyncProducer(kafkatest.Brokers(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = producer.Close() })
	return producer
}

// produceBroken publishes n records that break the contract (the consumer
// dead-letters them), each keyed by a purchase id of its own.
func produceBroken(t *testing.T, topic string, n int) {
	t.Helper()
	producer := syncProducer(t, "promoflow-test-broken")
	for range n {
		id := uuid.NewString()
		_, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(id),
			Value: sarama.StringEncoder(`{"PurchaseId":"` + id + `","Version":0}`),
			Headers: []sarama.RecordHeader{{Key: []byte(event.HeaderContractVersion), Value: []byte(event.ContractVersion)},
				{Key: []byte("_watermill_message_uuid"), Value: []byte(uuid.NewString())}}})
		require.NoError(t, err)
	}
}

// TestStatus_WatchIsABareFlagOrAPeriod: --watch redraws every 2s,
// --watch=10s every 10s, and --watch=false or none not at all.
func TestStatus_WatchIsABareFlagOrAPeriod(t *testing.T) {
	for args, want := range map[string]time.Duration{"": 0, "--watch": 2 * time.Second, "--watch=10s": 10 * time.Second,
		"--watch=false": 0} {
		var watch time.Duration
		s := newSettings("status", "")
		s.fs.Var((*watchValue)(&watch), "watch", "")
		require.NoError(t, s.parse(strings.Fields(args)), args)
		require.Equal(t, want, watch, args)
	}
	s := newSettings("status", "")
	s.fs.Var((*watchValue)(new(time.Duration)), "watch", "")
	require.ErrorContains(t, s.parse([]string{"--watch=often"}), "want true, false or a duration")
}
