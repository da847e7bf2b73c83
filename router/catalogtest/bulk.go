package catalogtest

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/google/uuid"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// Bulk is the cards of a bundle for a topic of many valid purchase events:
// 50 projects of 20 published objects, and the purchases, each Active on a
// project and one of its objects, that Event gives.
type Bulk struct {
	// Pairs is every project and object of the cards.
	Pairs [][2]uuid.UUID
}

// NewBulk makes the cards in b's database.
func NewBulk(t testing.TB, b *Bundle) *Bulk {
	t.Helper()
	k := &Bulk{}
	var projects, objects, homes []uuid.UUID
	for range 50 {
		p := uuid.New()
		projects = append(projects, p)
		for range 20 {
			o := uuid.New()
			objects, homes = append(objects, o), append(homes, p)
			k.Pairs = append(k.Pairs, [2]uuid.UUID{p, o})
		}
	}
	b.InsertCards(t, projects, objects, homes)
	return k
}

// InsertCards writes published project cards, and published property-object
// cards, object i of project homes[i], straight into b's database: faster
// than the feed for thousands of cards with no boost yet.
func (b *Bundle) InsertCards(t testing.TB, projects, objects, homes []uuid.UUID) {
	t.Helper()
	_, err := b.DB.Exec(`INSERT INTO catalog.project_cards (id, status, visibility)
		SELECT unnest($1::uuid[]), 'Published', 'Visible'`, pq.Array(projects))
	require.NoError(t, err)
	_, err = b.DB.Exec(`INSERT INTO catalog.property_object_cards (id, project_id, published, status)
		SELECT unnest($1::uuid[]), unnest($2::uuid[]), true, 'OnSale'`, pq.Array(objects), pq.Array(homes))
	require.NoError(t, err)
}

// Pair is the project and object of the i-th purchase.
func (k *Bulk) Pair(i int) [2]uuid.UUID { return k.Pairs[(i*7919)%len(k.Pairs)] }

// Event is the i-th purchase: Active on Pair(i), weight 1 + i%100.
func (k *Bulk) Event(i int) event.PurchaseChanged {
	pair := k.Pair(i)
	return PurchaseEvent(event.StatusActive, 1, 1+i%100, Target(event.TargetProject, pair[0]),
		Target(event.TargetPropertyObject, pair[1]))
}

// Produce sends the purchases 0..n-1 to topic, as the relay would, encoded
// beforehand and 5000 a round trip.
func (k *Bulk) Produce(t testing.TB, topic string, n int) {
	t.Helper()
	cfg := kafkatest.Cluster(t).DurableProducerConfig("test-bulk")
	cfg.Producer.Flush.MaxMessages = 5000
	producer, err := sarama.NewSyncProducer(kafkatest.Brokers(t), cfg)
	require.NoError(t, err)
	defer producer.Close()
	batch := make([]*sarama.ProducerMessage, 0, 5000)
	for i := range n {
		ev := k.Event(i)
		msg, err := event.NewMessage(ev, "bulk", time.Now())
		require.NoError(t, err)
		rec, err := kafka.DefaultMarshaler{}.Marshal(topic, msg)
		require.NoError(t, err)
		rec.Key = sarama.StringEncoder(ev.PurchaseId.String())
		if batch = append(batch, rec); len(batch) == cap(batch) || i == n-1 {
			require.NoError(t, producer.SendMessages(batch))
			batch = batch[:0]
		}
	}
}
