package dlqreplay_test

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/dlqreplay"
	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

type bundle struct {
	*catalogtest.Bundle
	cfg dlqreplay.Config
}

func setup(t *testing.T) *bundle {
	t.Helper()
	t.Parallel()
	b := &bundle{Bundle: catalogtest.New(t, true)}
	b.cfg = dlqreplay.Config{Kafka: b.Cfg.Kafka, DB: b.DB, DLQTopic: b.Cfg.DLQTopic, ReplayTopic: b.Cfg.ReplayTopic,
		SourceTopic: b.Cfg.Topic, Group: "pf-test-replay-" + kafkatest.RandomSuffix(), Log: slog.New(slog.DiscardHandler)}
	return b
}

// run replays with cfg and fails the test unless it ends by itself.
func run(t *testing.T, cfg dlqreplay.Config) dlqreplay.Result {
	t.Helper()
	r, err := dlqreplay.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := r.Run(ctx)
	require.NoError(t, err)
	require.NoError(t, ctx.Err(), "the replay ends by itself")
	return res
}

// deadLetter writes ev to the DLQ as the poison queue would, with a replay count.
func (b *bundle) deadLetter(t *testing.T, ev event.PurchaseChanged, code string, replays int) {
	t.Helper()
	msg, err := event.NewMessage(ev, "test", time.Now())
	require.NoError(t, err)
	msg.Metadata.Set(middleware.HeaderDLQErrorCode, code)
	msg.Metadata.Set(middleware.HeaderDLQReason, "test "+code)
	if replays > 0 {
		msg.Metadata.Set(middleware.HeaderDLQReplayCount, strconv.Itoa(replays))
	}
	require.NoError(t, b.Pub.Publish(b.Cfg.DLQTopic, msg))
}

func (b *bundle) dlqSize(t *testing.T) int64 { return catalogtest.TopicSize(t, b.Cfg.DLQTopic) }

// produceKeyed writes a raw record with a key of its own and extra headers.
func produceKeyed(t *testing.T, topic, key string, value []byte, headers map[string]string) {
	t.Helper()
	p, err := sarama.NewSyncProducer(kafkatest.Brokers(t), kafkatest.Cluster(t).DurableProducerConfig("test"))
	require.NoError(t, err)
	defer p.Close()
	msg := &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(key), Value: sarama.ByteEncoder(value)}
	for k, v := range headers {
		msg.Headers = append(msg.Headers, sarama.RecordHeader{Key: []byte(k), Value: []byte(v)})
	}
	_, _, err = p.SendMessage(msg)
	require.NoError(t, err)
}

// startWithTwoDeadLetters starts the consumer and has it dead-letter two
// records of the purchase topic, keyed k1 and k2.
func (b *bundle) startWithTwoDeadLetters(t *testing.T) {
	t.Helper()
	b.Start(t)
	produceKeyed(t, b.Cfg.Topic, "k1", []byte(`{"PurchaseId":"not json`), map[string]string{"_watermill_message_uuid": uuid.NewString()})
	produceKeyed(t, b.Cfg.Topic, "k2", []byte(`{"Version":0}`), map[string]string{"_watermill_message_uuid": uuid.NewString()})
	require.Eventually(t, func() bool { return b.dlqSize(t) == 2 }, 30*time.Second, 20*time.Millisecond)
}

func TestDLQReplay_DoesNotAmplifyWhileConsumerRuns(t *testing.T) {
	b := setup(t)
	b.startWithTwoDeadLetters(t)

	// Unfiltered replays, forced past the ledger, while the consumer
	// dead-letters each replayed record again: each run stops at the end it
	// saw, and after MaxReplays runs the two records are parked.
	b.cfg.Force = true
	var runs []dlqreplay.Result
	for size := int64(2); len(runs) < 10; {
		res := run(t, b.cfg)
		runs = append(runs, res)
		if res.Replayed == 0 {
			break
		}
		size += res.Replayed
		require.Eventually(t, func() bool { return b.dlqSize(t) == size }, 30*time.Second, 20*time.Millisecond,
			"the consumer dead-letters the replayed records again")
	}

	require.Len(t, runs, dlqreplay.MaxReplaysDefault+1)
	for _, res := range runs[:dlqreplay.MaxReplaysDefault] {
		require.EqualValues(t, 2, res.Replayed, "a run replays what it saw at its start, no more")
	}
	require.EqualValues(t, 2, runs[dlqreplay.MaxReplaysDefault].Parked)
	require.Never(t, func() bool { return b.dlqSize(t) > 2+2*dlqreplay.MaxReplaysDefault }, 2*time.Second, 100*time.Millisecond,
		"the DLQ grows by at most 2 × max-replays")
	require.EqualValues(t, 2+2*dlqreplay.MaxReplaysDefault, b.dlqSize(t))
}

// TestDLQReplay_EachOriginalOnceAcrossGroups: dead letters replayed in three
// rounds, each in a consumer group of its own, while the consumer
// dead-letters every replayed record again, reach the replay topic once
// per original: the ledger knows each original by the first origin that
// every copy in the DLQ carries.
func TestDLQReplay_EachOriginalOnceAcrossGroups(t *testing.T) {
	b := setup(t)
	b.startWithTwoDeadLetters(t)

	var replayed []int64
	for round := range 3 {
		cfg := b.cfg
		cfg.Group = "pf-test-replay-" + strconv.Itoa(round) + "-" + kafkatest.RandomSuffix()
		before := b.dlqSize(t)
		res := run(t, cfg)
		replayed = append(replayed, res.Replayed)
		// The consumer dead-letters the replays again: the next round finds
		// copies of both originals beside them.
		require.Eventually(t, func() bool { return b.dlqSize(t) == before+res.Replayed }, 30*time.Second, 20*time.Millisecond)
	}
	require.Equal(t, []int64{2, 0, 0}, replayed, "records replayed per round, each in a new group")
	onReplay := kafkatest.ReadTopic(t, b.Cfg.ReplayTopic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 2 })
	keys := map[string]int{}
	for _, m := range onReplay {
		keys[string(m.Key)]++
	}
	require.Equal(t, map[string]int{"k1": 1, "k2": 1}, keys, "each original once on the replay topic")
	require.EqualValues(t, 2, catalogtest.TopicSize(t, b.Cfg.ReplayTopic), "records on the replay topic")

	// --force replays on purpose what the ledger has.
	cfg := b.cfg
	cfg.Group, cfg.Force = "pf-test-replay-forced-"+kafkatest.RandomSuffix(), true
	require.Positive(t, run(t, cfg).Replayed)
}

func TestDLQReplay_StopsAtEndSeenAtStart(t *testing.T) {
	b := setup(t)
	project := uuid.New()
	b.ProjectCard(t, project)
	for range 4 {
		b.deadLetter(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 1, catalogtest.Target(event.TargetProject, project)),
			middleware.CodeConflictExhausted, 0)
	}
	b.Start(t)
	cfg := b.cfg
	cfg.Rate = 4 // about a second, so that records arrive while it runs
	r, err := dlqreplay.New(cfg)
	require.NoError(t, err)
	done := make(chan dlqreplay.Result, 1)
	go func() {
		res, err := r.Run(context.Background())
		require.NoError(t, err)
		done <- res
	}()
	require.Eventually(t, func() bool { return r.Progress().Snapshot().OffsetsTotal == 4 }, 30*time.Second, 5*time.Millisecond)
	for range 3 {
		b.deadLetter(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 1, catalogtest.Target(event.TargetProject, project)),
			middleware.CodeConflictExhausted, 0)
	}

	var res dlqreplay.Result
	select {
	case res = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the replay did not stop by itself")
	}
	require.EqualValues(t, 4, res.Read)
	require.EqualValues(t, 4, res.Replayed, "records that arrived after the start wait for the next run")
	require.EqualValues(t, 3, run(t, b.cfg).Replayed, "the next run takes them")
	b.WaitBoost(t, event.TargetProject, project, 7)
}

func TestDLQReplay_ParksRecordsPastMaxReplays(t *testing.T) {
	b := setup(t)
	project := uuid.New()
	b.ProjectCard(t, project)
	for _, replays := range []int{3, 5, 1} {
		b.deadLetter(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetProject, project)),
			middleware.CodeConflictExhausted, replays)
	}
	b.Start(t)

	res := run(t, b.cfg)

	require.EqualValues(t, 3, res.Read)
	require.EqualValues(t, 2, res.Parked)
	require.EqualValues(t, 1, res.Replayed)
	b.WaitBoost(t, event.TargetProject, project, 10)
	replayed := kafkatest.ReadTopic(t, b.Cfg.ReplayTopic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 1 })
	require.Len(t, replayed, 1)
	require.Equal(t, "2", kafkatest.Header(replayed[0], middleware.HeaderDLQReplayCount))
	require.EqualValues(t, 3, b.dlqSize(t), "parked records stay in the DLQ")
	require.Zero(t, run(t, b.cfg).Read, "and the group has moved past them")
}

func TestDLQ_KeepsKeyAndHeaders(t *testing.T) {
	b := setup(t)
	b.Start(t)
	id := uuid.NewString()
	produceKeyed(t, b.Cfg.Topic, "k1", []byte(`{"Version":0}`), map[string]string{
		"_watermill_message_uuid": id, "x-custom": "kept", event.HeaderCorrelationID: "corr-1"})

	dead := kafkatest.ReadTopic(t, b.Cfg.DLQTopic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 1 })[0]
	require.Equal(t, "k1", string(dead.Key), "the dead letter keeps the record key")
	require.Equal(t, id, kafkatest.Header(dead, "_watermill_message_uuid"))
	require.Equal(t, "kept", kafkatest.Header(dead, "x-custom"))
	require.Equal(t, "corr-1", kafkatest.Header(dead, event.HeaderCorrelationID))
	require.Equal(t, middleware.CodeContractViolation, kafkatest.Header(dead, middleware.HeaderDLQErrorCode))

	require.EqualValues(t, 1, run(t, b.cfg).Replayed)
	replayed := kafkatest.ReadTopic(t, b.Cfg.ReplayTopic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 1 })[0]
	require.Equal(t, "k1", string(replayed.Key), "the replay keeps the key")
	require.Equal(t, "kept", kafkatest.Header(replayed, "x-custom"))
	require.Equal(t, id, kafkatest.Header(replayed, "_watermill_message_uuid"))
	require.Equal(t, "1", kafkatest.Header(replayed, middleware.HeaderDLQReplayCount))

	// Dead-lettered again from the replay topic: still the key, the count
	// and the first origin.
	again := kafkatest.ReadTopic(t, b.Cfg.DLQTopic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 2 })
	last := again[len(again)-1]
	require.Equal(t, "k1", string(last.Key))
	for _, h := range []string{middleware.HeaderSourceTopic, middleware.HeaderOriginalPartition, middleware.HeaderOriginalOffset} {
		require.Equal(t, kafkatest.Header(dead, h), kafkatest.Header(last, h), "%s of the first dead letter", h)
	}
	require.Equal(t, b.Cfg.Topic, kafkatest.Header(last, middleware.HeaderSourceTopic))
	require.Equal(t, "1", kafkatest.Header(last, middleware.HeaderDLQReplayCount))
}

func TestDLQReplay_RefusesSourceTopicAsReplayTopic(t *testing.T) {
	t.Parallel()
	_, err := dlqreplay.New(dlqreplay.Config{Kafka: kafkakit.Cluster{Brokers: []string{"127.0.0.1:1"}}, ReplayTopic: event.Topic})
	require.ErrorContains(t, err, "the replay topic must differ from the source topic "+event.Topic)

	_, err = dlqreplay.New(dlqreplay.Config{Kafka: kafkakit.Cluster{Brokers: []string{"127.0.0.1:1"}}, ReplayTopic: "mine", SourceTopic: "mine"})
	require.ErrorContains(t, err, "must differ from the source topic mine")

	_, err = dlqreplay.New(dlqreplay.Config{Kafka: kafkakit.Cluster{Brokers: []string{"127.0.0.1:1"}}, ReplayTopic: middleware.DLQTopicDefault})
	require.ErrorContains(t, err, "must differ from the DLQ topic")
}

func TestDLQReplay_SecondRunInSameGroupFailsFast(t *testing.T) {
	b := setup(t)
	for range 6 {
		b.deadLetter(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 1, catalogtest.Target(event.TargetProject, uuid.New())),
			middleware.CodeConflictExhausted, 0)
	}
	b.Start(t)
	slow := b.cfg
	slow.Rate = 2
	first, err := dlqreplay.New(slow)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { _, err := first.Run(context.Background()); done <- err }()
	require.Eventually(t, func() bool { return first.Progress().Snapshot().Replayed >= 1 }, 30*time.Second, 5*time.Millisecond)

	second, err := dlqreplay.New(b.cfg)
	require.NoError(t, err)
	started := time.Now()
	_, err = second.Run(context.Background())
	require.ErrorIs(t, err, dlqreplay.ErrGroupBusy)
	require.ErrorContains(t, err, b.cfg.Group)
	require.Less(t, time.Since(started), 10*time.Second, "it fails fast, it does not hang")

	require.NoError(t, <-done, "the first run is not disturbed")
	require.EqualValues(t, 6, first.Progress().Snapshot().Replayed)
}

func TestDLQReplay_ReplaysFilteredRecordsToTheCatalogOnlyAndResumes(t *testing.T) {
	b := setup(t)
	project := uuid.New()
	b.ProjectCard(t, project)
	// Three dead letters, as the poison queue writes them, two of them conflicts.
	var conflicts []event.PurchaseChanged
	for i := range 3 {
		ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 10+i, catalogtest.Target(event.TargetProject, project))
		code := middleware.CodeConflictExhausted
		if i == 2 {
			code = middleware.CodeContractViolation
		} else {
			conflicts = append(conflicts, ev)
		}
		b.deadLetter(t, ev, code, 0)
	}
	b.Start(t)
	cfg := b.cfg
	cfg.ErrorCode = middleware.CodeConflictExhausted

	dry := cfg
	dry.DryRun = true
	res := run(t, dry)
	require.EqualValues(t, 3, res.Read)
	require.EqualValues(t, 2, res.Matched)
	require.EqualValues(t, 2, res.Replayed, "a dry run counts what it would replay")
	require.Never(t, func() bool { return b.BoostOf(event.TargetProject, project) != 0 }, 500*time.Millisecond, 50*time.Millisecond)
	require.Zero(t, catalogtest.TopicSize(t, b.Cfg.ReplayTopic), "a dry run publishes nothing")

	capped := cfg
	capped.Max = 1
	require.EqualValues(t, 1, run(t, capped).Replayed)
	b.WaitBoost(t, event.TargetProject, project, conflicts[0].BoostWeight)

	require.EqualValues(t, 1, run(t, cfg).Replayed, "the second run resumes after the first")
	b.WaitBoost(t, event.TargetProject, project, conflicts[0].BoostWeight+conflicts[1].BoostWeight)
	require.Zero(t, run(t, cfg).Read, "nothing is left for this filter")

	// Only the catalog reads the replay topic: the source topic got nothing.
	require.Zero(t, catalogtest.TopicSize(t, b.Cfg.Topic))
}

func TestDLQList_CountsByCodeAndReasonAndWritesNothing(t *testing.T) {
	b := setup(t)
	for i, code := range []string{middleware.CodeConflictExhausted, middleware.CodeConflictExhausted, middleware.CodeContractViolation} {
		b.deadLetter(t, catalogtest.PurchaseEvent(event.StatusActive, 1, 1, catalogtest.Target(event.TargetProject, uuid.New())),
			code, 3*(i%2))
	}
	r, err := dlqreplay.New(b.cfg)
	require.NoError(t, err)

	l, err := r.List(context.Background())

	require.NoError(t, err)
	require.EqualValues(t, 3, l.Records)
	require.Len(t, l.Rows, 2)
	require.Equal(t, dlqreplay.Row{Code: middleware.CodeConflictExhausted, Reason: "test conflict_exhausted", Count: 2, Parked: 1,
		Oldest: l.Rows[0].Oldest, Newest: l.Rows[0].Newest}, l.Rows[0])
	require.False(t, l.Rows[0].Newest.Before(l.Rows[0].Oldest))
	require.Equal(t, int64(1), l.Rows[1].Count)
	require.EqualValues(t, 3, run(t, b.cfg).Read, "listing committed nothing")
}
