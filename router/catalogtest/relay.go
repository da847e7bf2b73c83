package catalogtest

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/expire"
	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/router"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// Relay is a promotion process on a database, relaying its outbox to a topic
// of its own, for the tests that check what holds promotion events back.
type Relay struct {
	db    *sqlx.DB
	topic string

	mu   sync.Mutex
	sent map[string]sent // by MessageId
}

type sent struct {
	at    time.Time
	label string
}

// StartRelay runs a promotion router (its expirer idle) on db until the test
// ends.
func StartRelay(t testing.TB, db *sqlx.DB) *Relay {
	t.Helper()
	return StartRelayWith(t, db, router.PromotionConfig{})
}

// StartRelayWith is StartRelay with the router's config; its brokers, and
// short janitor and poll intervals where it sets none, are filled in.
func StartRelayWith(t testing.TB, db *sqlx.DB, cfg router.PromotionConfig) *Relay {
	t.Helper()
	r := &Relay{db: db, topic: kafkatest.Topic(t, 1), sent: map[string]sent{}}
	RunPromotion(t, db, r.topic, cfg)
	return r
}

// RunPromotion runs a promotion router (its expirer idle) on db, relaying
// its outbox to topic, until the test ends or the returned stop. cfg's
// brokers, and short janitor and poll intervals where it sets none, are
// filled in.
func RunPromotion(t testing.TB, db *sqlx.DB, topic string, cfg router.PromotionConfig) (stop func()) {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	exp, err := expire.New(db, expire.Config{Interval: time.Hour, Topic: topic}, log)
	require.NoError(t, err)
	m, err := router.NewPromotionMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	cfg.Kafka = kafkatest.Cluster(t)
	cfg.OutboxPollInterval = cmp.Or(cfg.OutboxPollInterval, 20*time.Millisecond)
	cfg.JanitorInterval = cmp.Or(cfg.JanitorInterval, 200*time.Millisecond)
	p, err := router.NewPromotion(db, exp, m, log, cfg)
	require.NoError(t, err)
	return RunUntilCleanup(t, p.Run, p.Router.IsRunning)
}

// Send writes a new purchase's event into the outbox in a transaction of
// its own, as the purchase API does, and notes when it committed and label.
// It is safe to call from any goroutine.
func (r *Relay) Send(label string) error {
	ev := PurchaseEvent(event.StatusActive, 1, 10, Target(event.TargetProject, uuid.New()))
	msg, err := event.NewMessage(ev, "relay-test", time.Now())
	if err != nil {
		return err
	}
	tx, err := outbox.BeginTx(context.Background(), r.db, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	if err := outbox.PublishTx(tx, r.topic, msg); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	r.mu.Lock()
	r.sent[msg.UUID] = sent{at: time.Now(), label: label}
	r.mu.Unlock()
	return nil
}

// SendEvery sends an event every interval, labelled with what label says
// then, until the returned stop.
func (r *Relay) SendEvery(t testing.TB, interval time.Duration, label func() string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				assert.NoError(t, r.Send(label()))
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// RequireDelays waits until every event sent is on the topic, and checks
// that each reached it (its record's timestamp) within most of its commit;
// a failure lists each late event with its label. It returns how many
// events were sent with each label, and the longest delay.
func (r *Relay) RequireDelays(t testing.TB, most time.Duration) (map[string]int, time.Duration) {
	t.Helper()
	labels := map[string]int{}
	var late []string
	var longest time.Duration
	r.eachDelay(t, func(label string, d time.Duration) {
		labels[label]++
		longest = max(longest, d)
		if d > most {
			late = append(late, fmt.Sprintf("sent during %s, on the topic %s after its commit", label, d.Round(time.Millisecond)))
		}
	})
	sort.Strings(late)
	require.Empty(t, late, "promotion events held back longer than %s:\n\t%s", most, strings.Join(late, "\n\t"))
	return labels, longest
}

// LongestDelays waits until every event sent is on the topic, and returns,
// by label, the longest time from an event's commit to its record's
// timestamp.
func (r *Relay) LongestDelays(t testing.TB) map[string]time.Duration {
	t.Helper()
	out := map[string]time.Duration{}
	r.eachDelay(t, func(label string, d time.Duration) { out[label] = max(out[label], d) })
	return out
}

// Delays waits until every event sent is on the topic, and returns each
// one's time from its commit to its record's timestamp.
func (r *Relay) Delays(t testing.TB) []time.Duration {
	t.Helper()
	var out []time.Duration
	r.eachDelay(t, func(_ string, d time.Duration) { out = append(out, d) })
	return out
}

// eachDelay waits until every event sent is on the topic, and calls each
// with every one's label and its time from commit to record timestamp.
func (r *Relay) eachDelay(t testing.TB, each func(label string, d time.Duration)) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	records := kafkatest.ReadTopic(t, r.topic, time.Minute, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= len(r.sent) })
	for _, rec := range records {
		if s, ok := r.sent[kafkatest.Header(rec, kafka.UUIDHeaderKey)]; ok {
			each(s.label, rec.Timestamp.Sub(s.at))
		}
	}
}
