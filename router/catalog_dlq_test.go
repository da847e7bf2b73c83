package router_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/app/testenv"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router"
)

// produceRaw publishes bytes with the contract headers, keyed by key.
func (b *catalogBundle) produceRaw(t *testing.T, key string, payload []byte) *message.Message {
	t.Helper()
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.Metadata.Set(event.HeaderContractVersion, event.ContractVersion)
	msg.Metadata.Set(event.HeaderAggregateID, key)
	msg.Metadata.Set(event.HeaderCorrelationID, "test")
	require.NoError(t, b.pub.Publish(b.cfg.Topic, msg))
	return msg
}

func TestCatalog_MalformedRecordGoesToDLQWithHeadersWhileThePartitionFlows(t *testing.T) {
	b := setupCatalog(t, true)
	project := uuid.New()
	b.projectCard(t, project)
	b.start(t)

	// One key, so the bad record and the good one share a partition.
	ev := purchaseEvent(event.StatusActive, 1, 10, target(event.TargetProject, project))
	bad := b.produceRaw(t, ev.PurchaseId.String(), []byte(`{"PurchaseId":"`+ev.PurchaseId.String()+`","Version":0}`))
	b.produce(t, ev)
	b.waitBoost(t, event.TargetProject, project, 10)

	dlq := testenv.ReadTopic(t, b.cfg.DLQTopic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 1 })
	rec := dlq[0]
	require.Equal(t, bad.Payload, message.Payload(rec.Value), "the original bytes")
	require.Equal(t, bad.UUID, testenv.Header(rec, "_watermill_message_uuid"))
	require.Equal(t, "test", testenv.Header(rec, event.HeaderCorrelationID), "the original headers")
	require.Equal(t, middleware.CodeContractViolation, testenv.Header(rec, middleware.HeaderDLQErrorCode))
	require.Contains(t, testenv.Header(rec, middleware.HeaderDLQReason), "Version")
	require.Equal(t, b.cfg.Topic, testenv.Header(rec, middleware.HeaderSourceTopic))
	require.NotEmpty(t, testenv.Header(rec, middleware.HeaderOriginalOffset))
	require.NotEmpty(t, testenv.Header(rec, middleware.HeaderOriginalPartition))
	require.Equal(t, 1.0, testutil.ToFloat64(b.metrics.DLQ))
}

func TestCatalog_DeterministicReplayAfterRebuild(t *testing.T) {
	b := setupCatalog(t, true)
	projects := []uuid.UUID{uuid.New(), uuid.New()}
	var objects []uuid.UUID
	for _, p := range projects {
		b.projectCard(t, p)
		for range 3 {
			o := uuid.New()
			b.objectCard(t, o, p, true)
			objects = append(objects, o)
		}
	}
	b.start(t)

	// A history with activations, removals, duplicates and stale snapshots.
	produced := 0
	for i := range 12 {
		ev := purchaseEvent(event.StatusActive, 1, 1+i, target(event.TargetProject, projects[i%2]),
			target(event.TargetPropertyObject, objects[i%len(objects)]))
		b.produce(t, ev)
		produced++
		if i%3 == 0 {
			ev.Status, ev.Version = event.StatusExpired, 2
			b.produce(t, ev)
			ev.Status, ev.Version = event.StatusActive, 1 // stale
			b.produce(t, ev)
			produced += 2
		}
	}
	b.waitConsumed(t, float64(produced))
	before := cardBoosts(t, b)

	rb := &router.Rebuilder{DB: b.db, Brokers: b.cfg.Brokers, Topics: []string{b.cfg.Topic, b.cfg.ReplayTopic},
		Chain: b.catalog.Chain, Log: slog.New(slog.DiscardHandler)}
	st, err := rb.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, "done", st.State)
	require.EqualValues(t, produced, st.Read)
	require.Equal(t, before, cardBoosts(t, b), "the rebuild restores every boost exactly")
	require.NotEmpty(t, before)
}

func cardBoosts(t *testing.T, b *catalogBundle) map[uuid.UUID]int { return cardBoostsTB(t, b) }

func cardBoostsTB(t testing.TB, b *catalogBundle) map[uuid.UUID]int {
	var rows []struct {
		ID    uuid.UUID `db:"id"`
		Boost int       `db:"promotion_boost"`
	}
	require.NoError(t, b.db.Select(&rows, `SELECT id, promotion_boost FROM catalog.project_cards
		UNION ALL SELECT id, promotion_boost FROM catalog.property_object_cards`))
	out := map[uuid.UUID]int{}
	for _, r := range rows {
		out[r.ID] = r.Boost
	}
	return out
}

func TestDLQReplay_ReplaysFilteredRecordsToTheCatalogOnlyAndResumes(t *testing.T) {
	b := setupCatalog(t, true)
	project := uuid.New()
	b.projectCard(t, project)

	// Three dead letters, as the poison queue writes them, two of them conflicts.
	dlqPub := b.pub
	var conflicts []event.PurchaseChanged
	for i := range 3 {
		ev := purchaseEvent(event.StatusActive, 1, 10+i, target(event.TargetProject, project))
		msg, err := event.NewMessage(ev, "test", time.Now())
		require.NoError(t, err)
		code := middleware.CodeConflictExhausted
		if i == 2 {
			code = middleware.CodeContractViolation
		} else {
			conflicts = append(conflicts, ev)
		}
		msg.Metadata.Set(middleware.HeaderDLQErrorCode, code)
		msg.Metadata.Set(middleware.HeaderDLQReason, "test "+code)
		require.NoError(t, dlqPub.Publish(b.cfg.DLQTopic, msg))
	}
	b.start(t)
	log := slog.New(slog.DiscardHandler)
	cfg := router.DLQReplayConfig{Brokers: b.cfg.Brokers, DLQTopic: b.cfg.DLQTopic, ReplayTopic: b.cfg.ReplayTopic,
		ErrorCode: middleware.CodeConflictExhausted, Group: "pf-test-replay-" + testenv.RandomSuffix()}

	dry := cfg
	dry.DryRun = true
	res, err := router.ReplayDLQ(context.Background(), dry, log)
	require.NoError(t, err)
	require.EqualValues(t, 3, res.Read)
	require.EqualValues(t, 2, res.Matched)
	require.Zero(t, res.Forwarded)
	require.Never(t, func() bool { return b.boostOf(event.TargetProject, project) != 0 }, 500*time.Millisecond, 50*time.Millisecond)

	capped := cfg
	capped.Max = 1
	res, err = router.ReplayDLQ(context.Background(), capped, log)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Forwarded)
	b.waitBoost(t, event.TargetProject, project, conflicts[0].BoostWeight)

	res, err = router.ReplayDLQ(context.Background(), cfg, log)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Forwarded, "the second run resumes after the first")
	b.waitBoost(t, event.TargetProject, project, conflicts[0].BoostWeight+conflicts[1].BoostWeight)

	res, err = router.ReplayDLQ(context.Background(), cfg, log)
	require.NoError(t, err)
	require.Zero(t, res.Read, "nothing is left for this filter")

	// Only the catalog reads the replay topic: the source topic got nothing.
	require.Zero(t, topicSize(t, b.cfg.Topic))
}
