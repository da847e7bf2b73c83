package router_test

import (
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

func TestRelay_BatchedKeepsPerPurchaseOrder(t *testing.T) {
	b := setupPromotion(t, 6)
	const purchases, versions = 300, 5
	rng := rand.New(rand.NewPCG(7, 11))
	ids := make([]uuid.UUID, purchases)
	for i := range ids {
		ids[i] = uuid.New()
	}
	// Every purchase's versions in increasing order, the purchases interleaved.
	next := make([]int64, purchases)
	var events []*message.Message
	for len(events) < purchases*versions {
		i := rng.IntN(purchases)
		if next[i] == versions {
			continue
		}
		next[i]++
		events = append(events, versionMessage(t, ids[i], next[i], "relay-order"))
	}
	// Transactions of 1..250 events, so one may hold several versions of a
	// purchase, and one of 600 that fills two rows.
	var txs [][]*message.Message
	for rest := events; len(rest) > 0; {
		n := min(len(rest), 1+rng.IntN(250))
		if len(txs) == 2 {
			n = min(len(rest), outbox.MaxEventsPerRow+100)
		}
		txs = append(txs, rest[:n])
		rest = rest[n:]
	}
	writeOutbox(t, b, txs...)
	var rows int
	require.NoError(t, b.db.Get(&rows, `SELECT count(*) FROM promotion.outbox_messages`))
	require.Equal(t, len(txs)+1, rows, "one row per transaction, two for the one past MaxEventsPerRow")
	stats, err := outbox.ReadStats(t.Context(), b.db)
	require.NoError(t, err)
	require.EqualValues(t, len(events), stats.Backlog, "the backlog counts events, not rows")

	b.start(t, time.Hour)
	records := kafkatest.ReadTopic(t, b.topic, time.Minute, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= len(events) })
	// One partition's records arrive in offset order, and a purchase has one partition.
	got := map[uuid.UUID][]int64{}
	for _, r := range records {
		ev, err := event.Parse(r.Value)
		require.NoError(t, err)
		require.Equal(t, ev.PurchaseId.String(), string(r.Key), "record key = PurchaseId")
		got[ev.PurchaseId] = append(got[ev.PurchaseId], ev.Version)
	}
	for _, id := range ids {
		require.Equal(t, []int64{1, 2, 3, 4, 5}, got[id], "purchase %s: every version, in increasing order", id)
	}
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(b.metrics.OutboxRelayed) == float64(len(events))
	}, 30*time.Second, 20*time.Millisecond, "the relayed counter counts events")
	require.EqualValues(t, len(events), catalogtest.TopicSize(t, b.topic), "no extra record on the topic")
}

// quickStepBack makes a relay that failed a publish come back soon: with a
// short RelayPublishTimeout, a refused row is tried again within seconds.
var quickStepBack = outbox.StepBackConfig{Pause: 100 * time.Millisecond, MaxPause: 200 * time.Millisecond}

func TestRelay_NackedBatchResendsOnlyTheRefusedEventsInOrder(t *testing.T) {
	b := setupPromotion(t, 1) // one partition: Kafka's order is the relay's order
	before := [][]*message.Message{purchaseEvents(t, 1, "relay-before"), purchaseEvents(t, 1, "relay-before"), purchaseEvents(t, 5, "relay-before")}
	batch := purchaseEvents(t, 40, "relay-nacked")
	after := [][]*message.Message{purchaseEvents(t, 10, "relay-after"), purchaseEvents(t, 1, "relay-after"), purchaseEvents(t, 10, "relay-after")}
	writeOutbox(t, b, append(append(before, batch), after...)...)
	waitVisible(t, b, len(before)+1+len(after))

	kp, err := kafkakit.NewBatchPublisher(kafkakit.BatchPublisherConfig{Cluster: kafkatest.Cluster(t), ClientID: "relay-test",
		Marshaler: kafka.NewWithPartitioningMarshaler(event.PartitionKey)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = kp.Close() })
	double := &refuseHalfOnce{Publisher: kp, target: batch[0].UUID}
	b.startRouter(t, router.PromotionConfig{RelayPublisher: double, RelayPublishTimeout: 2 * time.Second,
		RelayStepBack: quickStepBack}, expire.Config{Interval: time.Hour}, slog.New(slog.DiscardHandler))

	// The relay read every row as one message, in commit order. Kafka took
	// its first half and refused the rest; the relay then sent the refused
	// half again, in order, and not the half Kafka had taken.
	var all []*message.Message
	for _, tx := range append(append(before, batch), after...) {
		all = append(all, tx...)
	}
	half := len(all) / 2
	records := kafkatest.ReadTopic(t, b.topic, time.Minute, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= len(all) })
	got := make([]string, len(records))
	for i, r := range records {
		got[i] = kafkatest.Header(r, kafka.UUIDHeaderKey)
	}
	require.Equal(t, uuidsOf(all), got, "every event arrives once, in commit order")
	require.EqualValues(t, len(all), catalogtest.TopicSize(t, b.topic), "no extra record on the topic")

	calls := double.Calls()
	require.GreaterOrEqual(t, len(calls), 2)
	require.Equal(t, uuidsOf(all), calls[0], "the rows went to Kafka in one call, in commit order")
	require.Equal(t, uuidsOf(all[half:]), calls[1], "the next call resent the refused half alone, in order")

	// The publish spans tell the story: the first, of every event, failed
	// and names each refused event; the second sent the refused half alone.
	var publishes []sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		publishes = publishes[:0]
		for _, s := range spans.Ended() {
			if s.Name() == "promotion.outbox.publish" && attr(s, "messaging.destination.name") == b.topic {
				publishes = append(publishes, s)
			}
		}
		return len(publishes) >= 2
	}, 30*time.Second, 20*time.Millisecond)
	slices.SortFunc(publishes, func(x, y sdktrace.ReadOnlySpan) int { return x.StartTime().Compare(y.StartTime()) })
	first, resend := publishes[0], publishes[1]
	require.Equal(t, codes.Error, first.Status().Code)
	require.Equal(t, strconv.Itoa(len(all)), attr(first, "messaging.batch.message_count"))
	require.Equal(t, strconv.Itoa(len(all)-half), attr(first, "messaging.batch.failed_count"))
	var refused []string
	for _, e := range first.Events() {
		for _, a := range e.Attributes {
			if e.Name == "message refused" && a.Key == "messaging.message.id" {
				refused = append(refused, a.Value.AsString())
			}
		}
	}
	require.Equal(t, uuidsOf(all[half:]), refused, "the first publish names each refused event, in order")
	require.Equal(t, codes.Unset, resend.Status().Code)
	require.Equal(t, strconv.Itoa(len(all)-half), attr(resend, "messaging.batch.message_count"))
}

func TestRelay_RowsWrittenBeforeBatchesAreRelayed(t *testing.T) {
	b := setupPromotion(t, 1)
	// A row in the layout of releases before batches: one event, its envelope
	// straight in the row.
	legacy := purchaseEvents(t, 1, "relay-legacy")[0]
	tx, err := outbox.BeginTx(t.Context(), b.db, nil)
	require.NoError(t, err)
	pub, err := wmsql.NewPublisher(tx.Tx, wmsql.PublisherConfig{SchemaAdapter: outbox.Schema(0)}, nil)
	require.NoError(t, err)
	require.NoError(t, forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: outbox.ForwarderTopic}).Publish(b.topic, legacy))
	require.NoError(t, tx.Commit())
	batch := purchaseEvents(t, 3, "relay-legacy")
	writeOutbox(t, b, batch)
	stats, err := outbox.ReadStats(t.Context(), b.db)
	require.NoError(t, err)
	require.EqualValues(t, 4, stats.Backlog)

	b.start(t, time.Hour)
	records := kafkatest.ReadTopic(t, b.topic, time.Minute, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 4 })
	require.Equal(t, legacy.UUID, kafkatest.Header(records[0], kafka.UUIDHeaderKey))
	require.Equal(t, legacy.Metadata.Get(event.HeaderAggregateID), string(records[0].Key))
	require.Equal(t, []byte(legacy.Payload), records[0].Value)
	for i, m := range batch {
		require.Equal(t, m.UUID, kafkatest.Header(records[i+1], kafka.UUIDHeaderKey))
	}
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(b.metrics.OutboxRelayed) == 4
	}, 30*time.Second, 20*time.Millisecond)
}

func TestRelay_SmallTransactionsShareOneKafkaRequest(t *testing.T) {
	b := setupPromotion(t, 1)
	var txs [][]*message.Message
	for range 10 {
		txs = append(txs, purchaseEvents(t, 1, "relay-small"))
	}
	big := purchaseEvents(t, outbox.MergeRowsBelow+10, "relay-small")
	txs = append(txs, big)
	for range 5 {
		txs = append(txs, purchaseEvents(t, 1, "relay-small"))
	}
	// The relay reads no row of a transaction younger than the oldest
	// outbox writer open; gate, one, keeps them all hidden until it commits.
	gate, err := outbox.BeginTx(t.Context(), b.db, nil)
	require.NoError(t, err)
	gate.MustExec(`SELECT pg_current_xact_id()`)
	writeOutbox(t, b, txs...)
	kp, err := kafkakit.NewBatchPublisher(kafkakit.BatchPublisherConfig{Cluster: kafkatest.Cluster(t), ClientID: "relay-test",
		Marshaler: kafka.NewWithPartitioningMarshaler(event.PartitionKey)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = kp.Close() })
	recorder := &refuseHalfOnce{Publisher: kp} // no target: refuses nothing
	b.startRouter(t, router.PromotionConfig{RelayPublisher: recorder}, expire.Config{Interval: time.Hour}, slog.New(slog.DiscardHandler))
	require.NoError(t, gate.Commit())

	want, got := relayed(t, b.topic, txs)
	require.Equal(t, want, got, "every event once, in commit order")
	// Each request holds whole rows; the large row goes alone.
	calls := recorder.Calls()
	require.Less(t, len(calls), len(txs), "small rows share requests")
	row := 0
	for _, call := range calls {
		var rows []string
		for len(rows) < len(call) && row < len(txs) {
			rows = append(rows, uuidsOf(txs[row])...)
			row++
		}
		require.Equal(t, rows, call, "a request holds whole rows, in order")
		if slices.Contains(call, big[0].UUID) {
			require.Equal(t, uuidsOf(big), call, "the large row goes alone")
		}
	}
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(b.metrics.OutboxRelayed) == float64(len(want))
	}, 30*time.Second, 20*time.Millisecond, "the relayed counter counts events")
}

// refuseHalfOnce is the relay's Kafka publisher, except that the first call
// that holds target gets half of its events onto Kafka and the other half
// refused, as BatchPublisher reports a partly failed SendMessages (every
// event has a key of its own).
type refuseHalfOnce struct {
	message.Publisher
	target string

	mu      sync.Mutex
	refused bool
	calls   [][]string
}

func (d *refuseHalfOnce) Publish(topic string, msgs ...*message.Message) error {
	d.mu.Lock()
	d.calls = append(d.calls, uuidsOf(msgs))
	refuse := !d.refused && d.target != "" && slices.ContainsFunc(msgs, func(m *message.Message) bool { return m.UUID == d.target })
	d.refused = d.refused || refuse
	d.mu.Unlock()
	if !refuse {
		return d.Publisher.Publish(topic, msgs...)
	}
	half := len(msgs) / 2
	if err := d.Publisher.Publish(topic, msgs[:half]...); err != nil {
		return err
	}
	failed, delivered := make(map[string]error), make(map[string]bool)
	for _, m := range msgs[half:] {
		failed[m.UUID] = sarama.ErrNotEnoughReplicas
	}
	for _, m := range msgs[:half] {
		delivered[m.UUID] = true
	}
	return &kafkakit.BatchError{Failed: failed, Delivered: delivered, Total: len(msgs)}
}

// Calls are the UUIDs of each Publish call, in order.
func (d *refuseHalfOnce) Calls() [][]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([][]string(nil), d.calls...)
}

// versionMessage is an event of purchase id at version.
func versionMessage(t testing.TB, id uuid.UUID, version int64, correlationID string) *message.Message {
	t.Helper()
	ev := catalogtest.PurchaseEvent(event.StatusActive, version, 10, catalogtest.Target(event.TargetProject, uuid.New()))
	ev.PurchaseId = id
	msg, err := event.NewMessage(ev, correlationID, time.Now())
	require.NoError(t, err)
	return msg
}

// purchaseEvents are the first events of n new purchases.
func purchaseEvents(t testing.TB, n int, correlationID string) []*message.Message {
	out := make([]*message.Message, n)
	for i := range out {
		out[i] = versionMessage(t, uuid.New(), 1, correlationID)
	}
	return out
}

// writeOutbox writes each transaction's events to the outbox as the expirer
// and the purchase API do, one transaction after the other.
func writeOutbox(t testing.TB, b promotionBundle, txs ...[]*message.Message) {
	t.Helper()
	for _, msgs := range txs {
		tx, err := outbox.BeginTx(t.Context(), b.db, nil)
		require.NoError(t, err)
		require.NoError(t, outbox.PublishTx(tx, b.topic, msgs...))
		require.NoError(t, tx.Commit())
	}
}

// waitVisible waits until the relay can read all the outbox rows in one
// query: it reads only transactions below its horizon. Once visible, a row
// stays visible.
func waitVisible(t *testing.T, b promotionBundle, rows int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := b.db.Get(&n, `SELECT count(*) FROM `+outbox.MessagesTable+` WHERE transaction_id < promotion.outbox_relay_horizon(pg_current_snapshot())`)
		return err == nil && n == rows
	}, time.Minute, 10*time.Millisecond, "the relay cannot see all %d outbox rows", rows)
}

// relayed reads the topic until it holds as many records as txs has events,
// and returns the events' MessageIds in commit order and the records' in
// topic order.
func relayed(t *testing.T, topic string, txs [][]*message.Message) (want, got []string) {
	t.Helper()
	var all []*message.Message
	for _, tx := range txs {
		all = append(all, tx...)
	}
	records := kafkatest.ReadTopic(t, topic, time.Minute, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= len(all) })
	for _, r := range records {
		got = append(got, kafkatest.Header(r, kafka.UUIDHeaderKey))
	}
	return uuidsOf(all), got
}

func uuidsOf(msgs []*message.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.UUID
	}
	return out
}

// TestRelay_APageWhosePublishFailsIsNeitherVisibleNorAcked: with the
// process's default transactional id, a page whose first message is
// published and whose last one fails (an event larger than the producer
// sends) is one aborted Kafka transaction: each time the relay tries it, a
// read_committed reader sees nothing of it, and the outbox position stays
// before its first row.
func TestRelay_APageWhosePublishFailsIsNeitherVisibleNorAcked(t *testing.T) {
	b := setupPromotion(t, 1)
	targets := make([]event.Target, 20_000) // about 1.4 MB: past the producer's 1 MB a record
	for i := range targets {
		targets[i] = catalogtest.Target(event.TargetProject, uuid.New())
	}
	big, err := event.NewMessage(catalogtest.PurchaseEvent(event.StatusActive, 1, 10, targets...), "page-test", time.Now())
	require.NoError(t, err)
	// A row of one event, then one of MergeRowsBelow + 1 (a message of its
	// own, the page's last) that ends with the big event.
	writeOutbox(t, b, purchaseEvents(t, 1, "page-test"), append(purchaseEvents(t, outbox.MergeRowsBelow, "page-test"), big))
	waitVisible(t, b, 2)
	var first int64
	require.NoError(t, b.db.Get(&first, `SELECT min("offset") FROM `+outbox.MessagesTable))

	b.startRouter(t, router.PromotionConfig{RelayTransactionalID: router.RelayTransactionalIDFor(b.topic),
		RelayPublishTimeout: 2 * time.Second, RelayStepBack: outbox.StepBackConfig{Pause: 100 * time.Millisecond, MaxPause: 200 * time.Millisecond}},
		expire.Config{Interval: time.Hour}, slog.New(slog.DiscardHandler))
	require.Eventually(t, func() bool { return testutil.ToFloat64(b.metrics.OutboxStepBacks) >= 3 }, time.Minute, 10*time.Millisecond,
		"the relay tries the page, fails, and tries it again")

	var acked int64
	require.NoError(t, b.db.Get(&acked, `SELECT coalesce(max(offset_acked), 0) FROM `+outbox.OffsetsTable))
	require.Less(t, acked, first, "the outbox position moved into the failed page")

	producer, err := sarama.NewSyncProducer(kafkatest.Brokers(t), kafkatest.Cluster(t).DurableProducerConfig("page-test-sentinel"))
	require.NoError(t, err)
	defer producer.Close()
	_, _, err = producer.SendMessage(&sarama.ProducerMessage{Topic: b.topic, Key: sarama.StringEncoder("sentinel"), Value: sarama.StringEncoder("sentinel")})
	require.NoError(t, err)
	got := kafkatest.ReadTopic(t, b.topic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool {
		return len(ms) > 0 && string(ms[len(ms)-1].Key) == "sentinel"
	})
	require.Len(t, got, 1, "read_committed sees records of the failed page before the sentinel: %d records", len(got)-1)
}
