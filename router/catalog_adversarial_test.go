package router_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

const (
	// adversarialBound is how long a valid record may take to show its
	// effect, and how long a partition with lag may keep its committed
	// offset: the bound of TestCatalog_WideEventsAtOnceAllApply. Three
	// events of 12,000 targets at once take 3 to 5 s on an idle machine;
	// on two shared cores under -race with a load average of 6 to 16 they
	// took up to 30 s, and up to 46 s where one outlasted the unit of
	// work's 30 s timeout and was retried.
	adversarialBound = 60 * time.Second
	// adversarialTopicLimit is the purchase topic's max.message.bytes: below
	// franz-go's default ProducerBatchMaxBytes (1,000,012), so that the
	// broker, not the client, is what refuses a byte more.
	adversarialTopicLimit = 1_000_000
	// adversarialHeapLimit bounds the Go heap of the test process, the
	// catalog's included, while it runs: the product's goal is 100 MB RSS.
	adversarialHeapLimit = 100 << 20
)

// TestCatalog_NoRecordStallsItsPartition: records that any client may write
// to the public purchase topic, produced by franz-go rather than by the
// relay, each kind with its outcome: valid records apply within the bound,
// invalid ones are dead-lettered once with their code and the valid record
// after each on its key applies, no partition with lag keeps its committed
// offset for longer than the bound, and the projection equals the snapshot
// model, live and after a rebuild of the compacted topic, with the heap
// within its limit. It runs alone (no t.Parallel) so that the heap sampled
// is the catalog's and the test's.
func TestCatalog_NoRecordStallsItsPartition(t *testing.T) {
	b := catalogtest.New(t, true)
	// Compaction as soon as a segment closes, for the rebuild at the end.
	b.Cfg.Topic = kafkatest.TopicConfigured(t, 3, map[string]string{"cleanup.policy": "compact", "segment.ms": "100",
		"min.cleanable.dirty.ratio": "0.01", "max.message.bytes": strconv.Itoa(adversarialTopicLimit)})
	// The DLQ takes what the purchase topic takes, as two topics of the
	// broker's default do: a dead letter of a record at the limit, with its
	// x-dlq headers, does not fit it.
	b.Cfg.DLQTopic = kafkatest.TopicConfigured(t, 1, map[string]string{"max.message.bytes": strconv.Itoa(adversarialTopicLimit)})
	b.Cfg.Workers = 3
	a := newAdversary(t, b)
	heap := sampleHeap(t)

	rows := []struct {
		kind string
		send func(a *adversary)
	}{
		{"MessageId and header values of 0 B to 64 KB apply once", func(a *adversary) {
			for _, size := range []int{0, 1, 36, 3 << 10, 64 << 10} {
				ev := a.purchase(event.StatusActive, 1, 10+size%7, a.project())
				h := a.headers(messageIDOf(t, size), ev)
				for _, name := range []string{event.HeaderCorrelationID, "traceparent", "x-note"} {
					h = setHeader(h, name, messageIDOf(t, size))
				}
				a.send(ev, h, "applied")
				a.send(ev, h, "duplicate") // a redelivery: same MessageId, same bytes
			}
		}},
		{"an invalid record at the broker's size limit is dead-lettered by reference", func(a *adversary) {
			ev := a.purchase(event.StatusActive, 1, 11, a.project())
			key := ev.PurchaseId.String()
			a.names[key] = "at the size limit"
			pad := func(n int) []byte {
				raw := make([]byte, n)
				_, err := rand.Read(raw)
				require.NoError(t, err)
				// Random base64 is left uncompressed: snappy does not shrink it.
				return []byte(`{"PurchaseId":"` + key + `","Version":0,"Padding":"` + base64.StdEncoding.EncodeToString(raw)[:n] + `"}`)
			}
			rec := &kgo.Record{Key: []byte(key), Headers: a.headers(uuid.NewString(), ev)}
			for n := 0; batchSize(rec) != adversarialTopicLimit; {
				rec.Value = pad(n)
				n += adversarialTopicLimit - batchSize(rec) // the lengths' varints widen as it grows
			}
			require.Equal(t, adversarialTopicLimit, batchSize(rec))
			over := *rec
			over.Value = append(slices.Clone(rec.Value[:len(rec.Value)-2]), 'x', '"', '}')
			require.ErrorIs(t, a.cl.ProduceSync(context.Background(), &over).FirstErr(), kerr.MessageTooLarge,
				"a record batch of %d bytes is one more than the topic takes", batchSize(&over))
			a.raw(rec, middleware.CodeContractViolation)
			a.dead[key] = deadLetter{code: middleware.CodeContractViolation, byReference: true}
			a.send(ev, a.headers(uuid.NewString(), ev), "applied")
		}},
		{"invalid UTF-8, JSON nested 10,000 deep, 0 targets, 12,001 targets are dead-lettered", func(a *adversary) {
			wide := a.wide(event.MaxTargets + 1)
			for _, breaks := range []struct {
				name  string
				value func(ev event.PurchaseChanged) []byte
			}{
				{"invalid UTF-8", func(ev event.PurchaseChanged) []byte {
					return bytes.Replace(marshal(t, ev), []byte(`"PackageKind":"`), []byte("\"PackageKind\":\"T\xff\xfe"), 1)
				}},
				{"nested 10,000 deep", func(ev event.PurchaseChanged) []byte {
					return replaceTargets(t, ev, strings.Repeat("[", 10_000)+strings.Repeat("]", 10_000))
				}},
				{"0 targets", func(ev event.PurchaseChanged) []byte { return replaceTargets(t, ev, "[]") }},
				{"12,001 targets", func(ev event.PurchaseChanged) []byte { ev.Targets = wide; return marshal(t, ev) }},
			} {
				ev := a.purchase(event.StatusActive, 1, 12, a.project())
				a.names[ev.PurchaseId.String()] = breaks.name
				a.raw(&kgo.Record{Key: []byte(ev.PurchaseId.String()), Value: breaks.value(ev),
					Headers: a.headers(uuid.NewString(), ev)}, middleware.CodeContractViolation)
				a.send(ev, a.headers(uuid.NewString(), ev), "applied")
			}
		}},
		{"missing headers: no MessageId dedups by payload, no contract_version warns", func(a *adversary) {
			ev := a.purchase(event.StatusActive, 1, 13, a.project())
			a.send(ev, nil, "applied")
			a.send(ev, nil, "duplicate")
			a.mismatches += 2
		}},
		{"duplicated headers: the last value counts", func(a *adversary) {
			ev := a.purchase(event.StatusActive, 1, 14, a.project())
			first, last := uuid.NewString(), uuid.NewString()
			h := append(setHeader(a.headers(first, ev), event.HeaderContractVersion, "2"),
				kgo.RecordHeader{Key: kafka.UUIDHeaderKey, Value: []byte(last)},
				kgo.RecordHeader{Key: event.HeaderContractVersion, Value: []byte(event.ContractVersion)})
			a.send(ev, h, "applied")                     // no contract mismatch: the last contract_version is the expected one
			a.send(ev, a.headers(last, ev), "duplicate") // the last MessageId is the one its mark holds
		}},
		{"one MessageId, two payloads: the newer version applies, counted", func(a *adversary) {
			id := uuid.NewString()
			v1 := a.purchase(event.StatusActive, 1, 15, a.project())
			a.send(v1, a.headers(id, v1), "applied")
			v2 := v1
			v2.Version, v2.BoostWeight = 2, 25
			a.send(v2, a.headers(id, v2), "applied")
			a.reused++
		}},
		{"a tombstone is a counted no-op", func(a *adversary) {
			v1 := a.purchase(event.StatusActive, 1, 16, a.project())
			a.send(v1, a.headers(uuid.NewString(), v1), "applied")
			a.raw(&kgo.Record{Key: []byte(v1.PurchaseId.String()), Headers: a.headers(uuid.NewString(), v1)}, "tombstone")
			v2 := v1
			v2.Version, v2.BoostWeight = 2, 26
			a.send(v2, a.headers(uuid.NewString(), v2), "applied")
		}},
		{"versions out of order: the older is stale", func(a *adversary) {
			v3 := a.purchase(event.StatusActive, 3, 17, a.project())
			a.send(v3, a.headers(uuid.NewString(), v3), "applied")
			v2 := v3
			v2.Version, v2.BoostWeight = 2, 99
			a.send(v2, a.headers(uuid.NewString(), v2), "stale")
			v4 := v3
			v4.Version, v4.BoostWeight = 4, 27 // in order again, so that compaction keeps the highest
			a.send(v4, a.headers(uuid.NewString(), v4), "applied")
		}},
		{"12,000 targets, three at once, apply", func(a *adversary) {
			wide, taken := a.wide(event.MaxTargets), map[int32]bool{}
			for weight := 1; len(taken) < 3; weight++ {
				ev := a.purchase(event.StatusActive, 1, weight, wide...)
				if p := partitionOf(t, b, ev); !taken[p] {
					taken[p] = true
					require.Equal(t, p, a.send(ev, a.headers(uuid.NewString(), ev), "applied"),
						"franz-go puts the record where Sarama's FNV-1a hash does")
				}
			}
		}},
		{"target sets that grow and shrink: each version replaces the last", func(a *adversary) {
			p0, p1 := a.project(), a.project()
			o0, hidden, o1 := a.object(p0.TargetId, true), a.object(p0.TargetId, false), a.object(p1.TargetId, true)
			ev := a.purchase(event.StatusActive, 1, 18, p0)
			for i, targets := range [][]event.Target{{p0}, {p0, p1, o0, hidden}, {o1}, {p1, o1, hidden}, {o0}} {
				ev.Version, ev.Targets = int64(i+1), targets
				if i == 3 {
					ev.Status = event.StatusExpired
				}
				a.send(ev, a.headers(uuid.NewString(), ev), "applied")
			}
		}},
		{"an unknown contract version: warn and proceed", func(a *adversary) {
			ev := a.purchase(event.StatusActive, 1, 19, a.project())
			a.send(ev, setHeader(a.headers(uuid.NewString(), ev), event.HeaderContractVersion, "2"), "applied")
			a.mismatches++
		}},
	}

	b.Start(t)
	// The bound is the records', not the group's first join: a record of
	// Post targets alone shows when the consumer reads every partition.
	joined := time.Now()
	for p := range 3 {
		for taken := int32(-1); taken != int32(p); {
			ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 1, catalogtest.Target(event.TargetPost, uuid.New()))
			if taken = partitionOf(t, b, ev); taken == int32(p) {
				a.send(ev, a.headers(uuid.NewString(), ev), "post_only")
			}
		}
	}
	require.Eventually(t, func() bool { return testutil.ToFloat64(b.Metrics.Consumed.WithLabelValues("post_only")) == 3 },
		time.Minute, 20*time.Millisecond, "the consumer did not read every partition within a minute")
	t.Logf("the consumer reads every partition after %s", time.Since(joined).Round(time.Millisecond))
	stalls := watchCommits(t, b)
	type sent struct {
		purchases map[uuid.UUID]event.PurchaseChanged
		at        time.Time
	}
	var done []sent
	for _, row := range rows {
		a.rowLatest, a.row = map[uuid.UUID]event.PurchaseChanged{}, row.kind
		row.send(a)
		done = append(done, sent{a.rowLatest, time.Now()})
	}
	for i, row := range rows {
		want, ids := catalogtest.ModelContributions(done[i].purchases), slices.Collect(maps.Keys(done[i].purchases))
		for have := b.Replica(t, ids...); !slices.Equal(want, have); have = b.Replica(t, ids...) {
			require.Less(t, time.Since(done[i].at), adversarialBound, "%s: the replica does not show the row's valid records "+
				"%s after them: %s", row.kind, adversarialBound, replicaDiff(want, have))
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("%s: %s", row.kind, time.Since(done[i].at).Round(time.Millisecond))
	}
	want := catalogtest.ModelContributions(a.latest)
	boosts := b.ModelBoosts(t, want)
	require.Eventually(t, func() bool { return maps.Equal(boosts, b.CardBoosts(t)) }, adversarialBound, 20*time.Millisecond,
		"cards differ from the model")
	a.checkDeadLetters()
	a.checkCounters()
	require.Eventually(t, func() bool { return lagOf(t, b) == "" }, adversarialBound, 100*time.Millisecond,
		"the group's committed offsets do not reach the end of the topic: %s", lagOf(t, b))
	require.Empty(t, stalls(), "a partition with lag kept its committed offset for longer than %s", adversarialBound)

	// Post-only records roll the segments until the cleaner has removed
	// superseded records (invalid ones and the tombstone among them); then a
	// rebuild of what is left gives the same projection.
	require.Eventually(t, func() bool {
		ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 1, catalogtest.Target(event.TargetPost, uuid.New()))
		a.send(ev, a.headers(uuid.NewString(), ev), "post_only")
		return catalogtest.TopicSize(t, b.Cfg.Topic) < int64(a.produced)
	}, 45*time.Second, 500*time.Millisecond, "the topic was not compacted")
	require.Equal(t, want, b.Replica(t), "live replica")
	live := b.CardBoosts(t)
	st := runRebuild(t, b)
	require.Less(t, st.Read, int64(a.produced), "the rebuild read a compacted topic")
	require.Equal(t, want, b.Replica(t), "rebuilt replica")
	require.Equal(t, live, b.CardBoosts(t), "rebuilt cards")

	peak := heap()
	t.Logf("%d records; %v retries; peak heap %d MiB; test process %s", a.produced,
		testutil.ToFloat64(b.Metrics.Retries), peak>>20, vmRSS())
	require.LessOrEqual(t, peak, uint64(adversarialHeapLimit), "the heap reached %d MiB", peak>>20)
}

// adversary writes the records of the rows with franz-go and keeps what they
// must give: the model, the outcomes and the dead letters.
type adversary struct {
	t  *testing.T
	b  *catalogtest.Bundle
	cl *kgo.Client
	// produced counts the records written to the purchase topic.
	produced int
	// latest is each purchase's latest valid event, rowLatest the current
	// row's: the snapshot model.
	latest, rowLatest map[uuid.UUID]event.PurchaseChanged
	outcomes          map[string]int
	dead              map[string]deadLetter
	// names says what each key's records are, for failure messages: the
	// row's kind, or the invalid record's.
	names map[string]string
	row   string
	// invalidAt is when each invalid record was produced, by key.
	invalidAt  map[string]time.Time
	reused     int
	mismatches int
	// wideCards are the cards of the wide events, made once.
	wideCards []event.Target
}

// deadLetter is what a dead-lettered record's DLQ record must say.
type deadLetter struct {
	code        string
	byReference bool
}

func newAdversary(t *testing.T, b *catalogtest.Bundle) *adversary {
	// franz-go's defaults, except the partitioner: the contract's, Sarama's
	// FNV-1a hash of the key (kgo's default murmur2 would put a purchase's
	// records on another partition than the relay does).
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkatest.Brokers(t)...), kgo.DefaultProduceTopic(b.Cfg.Topic),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(fnv32a))))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return &adversary{t: t, b: b, cl: cl, latest: map[uuid.UUID]event.PurchaseChanged{},
		outcomes: map[string]int{}, dead: map[string]deadLetter{}, names: map[string]string{},
		invalidAt: map[string]time.Time{}}
}

func fnv32a(key []byte) uint32 {
	h := fnv.New32a()
	_, _ = h.Write(key)
	return h.Sum32()
}

// send writes ev, valid, under its PurchaseId with headers, expecting
// outcome, and returns the partition it went to.
func (a *adversary) send(ev event.PurchaseChanged, headers []kgo.RecordHeader, outcome string) int32 {
	if outcome != "stale" && outcome != "duplicate" {
		a.latest[ev.PurchaseId] = ev
		if a.rowLatest != nil && outcome != "post_only" {
			a.rowLatest[ev.PurchaseId] = ev
		}
	}
	return a.raw(&kgo.Record{Key: []byte(ev.PurchaseId.String()), Value: marshal(a.t, ev), Headers: headers}, outcome)
}

// raw writes rec as it is: a consumed outcome is counted as expected, any
// other is the DLQ code of the record's key.
func (a *adversary) raw(rec *kgo.Record, outcome string) int32 {
	a.t.Helper()
	if _, ok := a.names[string(rec.Key)]; !ok {
		a.names[string(rec.Key)] = a.row
	}
	res, err := a.cl.ProduceSync(context.Background(), rec).First()
	require.NoError(a.t, err, "produce a record of %d bytes", batchSize(rec))
	a.produced++
	switch outcome {
	case "applied", "stale", "duplicate", "post_only", "tombstone":
		a.outcomes[outcome]++
	default:
		if _, ok := a.dead[string(rec.Key)]; !ok {
			a.dead[string(rec.Key)] = deadLetter{code: outcome}
		}
		a.invalidAt[string(rec.Key)] = res.Timestamp
	}
	return res.Partition
}

// headers are the contract's headers of ev, with messageID.
func (a *adversary) headers(messageID string, ev event.PurchaseChanged) []kgo.RecordHeader {
	h := func(k, v string) kgo.RecordHeader { return kgo.RecordHeader{Key: k, Value: []byte(v)} }
	return []kgo.RecordHeader{h(kafka.UUIDHeaderKey, messageID), h(event.HeaderContractVersion, event.ContractVersion),
		h("event_type", "PromotionPurchaseChanged"), h("aggregate_type", "PromotionPurchase"),
		h(event.HeaderAggregateID, ev.PurchaseId.String()), h("occurred_at", time.Now().UTC().Format(time.RFC3339Nano)),
		h(event.HeaderCorrelationID, "adversarial"), h("tenant_id", ev.TenantId.String())}
}

// setHeader sets the value of the header name, adding it when missing.
func setHeader(h []kgo.RecordHeader, name, value string) []kgo.RecordHeader {
	for i := range h {
		if h[i].Key == name {
			h[i].Value = []byte(value)
			return h
		}
	}
	return append(h, kgo.RecordHeader{Key: name, Value: []byte(value)})
}

func (a *adversary) purchase(status event.Status, version int64, weight int, targets ...event.Target) event.PurchaseChanged {
	return catalogtest.PurchaseEvent(status, version, weight, targets...)
}

// project is a new project card as a target.
func (a *adversary) project() event.Target {
	id := uuid.New()
	a.b.ProjectCard(a.t, id)
	return catalogtest.Target(event.TargetProject, id)
}

// object is a new property-object card of project as a target.
func (a *adversary) object(project uuid.UUID, published bool) event.Target {
	id := uuid.New()
	a.b.ObjectCard(a.t, id, project, published)
	return catalogtest.Target(event.TargetPropertyObject, id)
}

// wide is n targets over 12,000 cards: 2,000 projects and 10,000 objects
// of other projects (no cascade), and a Post target past them.
func (a *adversary) wide(n int) []event.Target {
	if a.wideCards == nil {
		projects, objects, homes := make([]uuid.UUID, 2_000), make([]uuid.UUID, 10_000), make([]uuid.UUID, 10_000)
		for i := range projects {
			projects[i] = uuid.New()
			a.wideCards = append(a.wideCards, catalogtest.Target(event.TargetProject, projects[i]))
		}
		for i := range objects {
			objects[i], homes[i] = uuid.New(), uuid.New()
			a.wideCards = append(a.wideCards, catalogtest.Target(event.TargetPropertyObject, objects[i]))
		}
		a.b.InsertCards(a.t, projects, objects, homes)
	}
	out := slices.Clone(a.wideCards[:min(n, len(a.wideCards))])
	for len(out) < n {
		out = append(out, catalogtest.Target(event.TargetPost, uuid.New()))
	}
	return out
}

// checkCounters compares the consumer's counters with the outcomes the rows
// expect.
func (a *adversary) checkCounters() {
	m := a.b.Metrics
	have := func() map[string]int {
		out := map[string]int{}
		for o := range a.outcomes {
			out[o] = int(testutil.ToFloat64(m.Consumed.WithLabelValues(o)))
		}
		return out
	}
	require.Eventually(a.t, func() bool { return maps.Equal(a.outcomes, have()) }, adversarialBound, 20*time.Millisecond,
		"consumed outcomes: want %v, have %v", a.outcomes, have())
	require.Equal(a.t, a.outcomes["stale"], int(testutil.ToFloat64(m.Stale)), "stale")
	require.Equal(a.t, a.reused, int(testutil.ToFloat64(m.MessageIDReused)), "MessageIds reused with another payload")
	require.Equal(a.t, a.mismatches, int(testutil.ToFloat64(m.ContractMismatch)), "contract version mismatches")
	require.Equal(a.t, len(a.dead), int(testutil.ToFloat64(m.DLQ)), "dead letters")
}

// checkDeadLetters reads the DLQ: one dead letter per invalid record, with
// its code, by reference where the record would not fit.
func (a *adversary) checkDeadLetters() {
	dlq, _ := kafkatest.ReadTopicWithin(a.t, a.b.Cfg.DLQTopic, adversarialBound,
		func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= len(a.dead) })
	have := map[string]deadLetter{}
	for _, m := range dlq {
		key, reason := string(m.Key), kafkatest.Header(m, middleware.HeaderDLQReason)
		require.NotContains(a.t, have, key, "the record %s (key %s) was dead-lettered twice", a.names[key], key)
		have[key] = deadLetter{code: kafkatest.Header(m, middleware.HeaderDLQErrorCode),
			byReference: kafkatest.Header(m, middleware.HeaderDLQByReference) == "true"}
		_, invalid := a.dead[key]
		require.True(a.t, invalid, "a valid record of the row %q (key %s) was dead-lettered as %s: %.300s",
			a.names[key], key, have[key].code, reason)
		require.NotEmpty(a.t, reason, "%s: a dead letter says why", key)
		a.t.Logf("dead letter of the record %s, %s after it was produced: %s: %.160s", a.names[key],
			m.Timestamp.Sub(a.invalidAt[key]).Round(time.Millisecond), have[key].code, reason)
	}
	for key, want := range a.dead {
		require.Equal(a.t, want, have[key], "the dead letter of the record %s (key %s)", a.names[key], key)
	}
	require.Len(a.t, have, len(a.dead), "dead letters")
}

// batchSize is the bytes of a record batch that holds rec alone,
// uncompressed, as the broker compares it with max.message.bytes: 61 bytes
// of batch header and the record, whose lengths are zigzag varints.
func batchSize(rec *kgo.Record) int {
	varint := func(n int) int {
		size, z := 1, uint64(n)<<1
		for ; z >= 0x80; z >>= 7 {
			size++
		}
		return size
	}
	body := 1 + varint(0) + varint(0) + varint(len(rec.Key)) + len(rec.Key) + varint(len(rec.Value)) + len(rec.Value) +
		varint(len(rec.Headers))
	for _, h := range rec.Headers {
		body += varint(len(h.Key)) + len(h.Key) + varint(len(h.Value)) + len(h.Value)
	}
	return 61 + varint(body) + body
}

func marshal(t *testing.T, ev event.PurchaseChanged) []byte {
	raw, err := json.Marshal(ev)
	require.NoError(t, err)
	return raw
}

// replaceTargets is ev's JSON with targets, raw, as its Targets.
func replaceTargets(t *testing.T, ev event.PurchaseChanged, targets string) []byte {
	ev.Targets = []event.Target{{TargetKind: event.TargetPost, TargetId: uuid.Nil}}
	placeholder, err := json.Marshal(ev.Targets)
	require.NoError(t, err)
	out := strings.Replace(string(marshal(t, ev)), `"Targets":`+string(placeholder), `"Targets":`+targets, 1)
	require.Contains(t, out, `"Targets":`+targets[:1])
	return []byte(out)
}

// watchCommits samples every partition's committed offset and high-water
// mark until the test ends; the returned func lists the stalls seen so far:
// a partition with lag whose committed offset stayed for longer than the
// bound.
func watchCommits(t *testing.T, b *catalogtest.Bundle) func() []string {
	admin, err := sarama.NewClusterAdmin(kafkatest.Brokers(t), kafkatest.Cluster(t).ClientConfig("test-watch"))
	require.NoError(t, err)
	client, err := sarama.NewClient(kafkatest.Brokers(t), kafkatest.Cluster(t).ClientConfig("test-watch"))
	require.NoError(t, err)
	type seen struct {
		offset int64
		since  time.Time
	}
	var (
		mu     sync.Mutex
		stalls []string
		last   = map[int32]seen{}
	)
	stop := sampleEvery(t, 250*time.Millisecond, func(context.Context) {
		res, err := admin.ListConsumerGroupOffsets(b.Cfg.ConsumerGroup, map[string][]int32{b.Cfg.Topic: {0, 1, 2}})
		if err != nil {
			return
		}
		for p, blk := range res.Blocks[b.Cfg.Topic] {
			end, err := client.GetOffset(b.Cfg.Topic, p, sarama.OffsetNewest)
			if err != nil {
				continue
			}
			s, ok := last[p]
			if !ok || s.offset != blk.Offset || blk.Offset >= end {
				last[p] = seen{blk.Offset, time.Now()}
				continue
			}
			if still := time.Since(s.since); still > adversarialBound {
				mu.Lock()
				stalls = append(stalls, fmt.Sprintf("partition %d at %d of %d for %s", p, blk.Offset, end, still.Round(time.Second)))
				mu.Unlock()
				last[p] = seen{blk.Offset, time.Now()}
			}
		}
	})
	t.Cleanup(func() {
		stop()
		_ = admin.Close()
		_ = client.Close()
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(stalls)
	}
}

// lagOf lists the partitions whose committed offset is short of their
// high-water mark, or is "" when there is none.
func lagOf(t *testing.T, b *catalogtest.Bundle) string {
	admin, err := sarama.NewClusterAdmin(kafkatest.Brokers(t), kafkatest.Cluster(t).ClientConfig("test-lag"))
	require.NoError(t, err)
	defer admin.Close()
	res, err := admin.ListConsumerGroupOffsets(b.Cfg.ConsumerGroup, map[string][]int32{b.Cfg.Topic: {0, 1, 2}})
	require.NoError(t, err)
	var lag []string
	for p, end := range catalogtest.PartitionSizes(t, b.Cfg.Topic) {
		if blk := res.GetBlock(b.Cfg.Topic, p); blk == nil || blk.Offset < end {
			lag = append(lag, fmt.Sprintf("partition %d: committed %v of %d", p, blk, end))
		}
	}
	slices.Sort(lag)
	return strings.Join(lag, ", ")
}

// sampleHeap samples the process's heap of live and not yet swept objects
// every 50 ms until the test ends; the returned func is the peak so far.
func sampleHeap(t *testing.T) func() uint64 {
	var (
		mu   sync.Mutex
		peak uint64
	)
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	sampleEvery(t, 50*time.Millisecond, func(context.Context) {
		metrics.Read(sample)
		mu.Lock()
		peak = max(peak, sample[0].Value.Uint64())
		mu.Unlock()
	})
	return func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}

// sampleEvery calls sample at once and then every period, in a goroutine of
// its own, until the returned stop is called or the test ends; stop returns
// once sample has returned for the last time.
func sampleEvery(t testing.TB, period time.Duration, sample func(ctx context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			sample(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// vmRSS is the test process's resident set, as /proc says it.
func vmRSS() string {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "RSS unknown: " + err.Error()
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rss, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return "RSS " + strings.TrimSpace(rss)
		}
	}
	return "RSS unknown"
}

// replicaDiff says how have differs from want, in a few lines.
func replicaDiff(want, have []catalogtest.Contribution) string {
	missing, extra := diffRows(want, have), diffRows(have, want)
	return fmt.Sprintf("%d rows missing (first: %v), %d rows too many (first: %v)",
		len(missing), missing[:min(3, len(missing))], len(extra), extra[:min(3, len(extra))])
}

// diffRows are the rows of x that y lacks.
func diffRows(x, y []catalogtest.Contribution) []catalogtest.Contribution {
	in := map[catalogtest.Contribution]bool{}
	for _, c := range y {
		in[c] = true
	}
	var out []catalogtest.Contribution
	for _, c := range x {
		if !in[c] {
			out = append(out, c)
		}
	}
	return out
}

// partitionOf is the partition of ev's records by the contract's
// partitioner, as the relay's Sarama computes it.
func partitionOf(t *testing.T, b *catalogtest.Bundle, ev event.PurchaseChanged) int32 {
	p, err := sarama.NewHashPartitioner(b.Cfg.Topic).Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(ev.PurchaseId.String())}, 3)
	require.NoError(t, err)
	return p
}
