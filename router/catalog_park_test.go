package router_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestDLQ_ParkMovesOneRecordAndThePartitionGoesOn: a valid record fails
// for ever with a systemic error (disk_full, raised by a trigger
// for its purchase's first version), so it is retried without end and the
// record after it on its key never applies. A park request for its
// partition and offset (what `promoflow dlq park` writes) makes the
// consumer that owns the partition dead-letter that one record, with the
// operator's reason, and go on: the next record applies, and the request is
// marked done.
func TestDLQ_ParkMovesOneRecordAndThePartitionGoesOn(t *testing.T) {
	b := setupCatalog(t, true)
	project := uuid.New()
	b.ProjectCard(t, project)
	stuck := catalogtest.PurchaseEvent(event.StatusActive, 1, 10, catalogtest.Target(event.TargetProject, project))
	_, err := b.DB.Exec(`
		CREATE FUNCTION public.stuck() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.purchase_id = '` + stuck.PurchaseId.String() + `' AND NEW.version = 1 THEN
				RAISE EXCEPTION 'held by the test' USING ERRCODE = 'disk_full';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER stuck BEFORE INSERT OR UPDATE ON catalog.promotion_contributions
			FOR EACH ROW EXECUTE FUNCTION public.stuck()`)
	require.NoError(t, err)
	b.Start(t)

	key := stuck.PurchaseId.String()
	partition, err := sarama.NewHashPartitioner(b.Cfg.Topic).Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(key)}, 3)
	require.NoError(t, err)
	offset := catalogtest.PartitionSizes(t, b.Cfg.Topic)[partition]
	b.Produce(t, stuck)
	next := stuck
	next.Version, next.BoostWeight = 2, 25
	b.Produce(t, next)
	require.Never(t, func() bool { return b.BoostOf(event.TargetProject, project) != 0 }, 3*time.Second, 50*time.Millisecond,
		"the record behind the failing one on its key waits")

	ctx := context.Background()
	// The stuck partition is shown: to the alert, and to promoflow status.
	require.Eventually(t, func() bool {
		for _, p := range b.Metrics.Stuck.Partitions(time.Now()) {
			if p.Partition == partition && p.Offset == offset && strings.Contains(p.Error, "held by the test") {
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "the stuck partition is tracked with its offset and error")
	require.Eventually(t, func() bool {
		stuck, err := middleware.StuckInDB(ctx, b.DB, b.Cfg.Topic, 0, time.Minute)
		require.NoError(t, err)
		return len(stuck) == 1 && stuck[0].Partition == partition && stuck[0].Offset == offset
	}, 10*time.Second, 20*time.Millisecond, "promoflow status reads the stuck partition from the database")

	req := middleware.ParkRequest{Topic: b.Cfg.Topic, Partition: partition, Offset: offset, Reason: "bad row in the replica, ticket 42"}
	require.NoError(t, middleware.RequestPark(ctx, b.DB, req))
	b.WaitBoost(t, event.TargetProject, project, 25)

	dlq := kafkatest.ReadTopic(t, b.Cfg.DLQTopic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 1 })
	require.Len(t, dlq, 1, "one record is dead-lettered")
	rec := dlq[0]
	require.Equal(t, middleware.CodeParked, kafkatest.Header(rec, middleware.HeaderDLQErrorCode))
	require.Contains(t, kafkatest.Header(rec, middleware.HeaderDLQReason), "ticket 42")
	require.Equal(t, strconv.FormatInt(offset, 10), kafkatest.Header(rec, middleware.HeaderOriginalOffset))
	require.Eventually(t, func() bool {
		var done bool
		require.NoError(t, b.DB.Get(&done, `SELECT done_at IS NOT NULL FROM catalog.dlq_park_requests
			WHERE topic = $1 AND partition = $2 AND "offset" = $3`, req.Topic, req.Partition, req.Offset))
		return done
	}, 10*time.Second, 20*time.Millisecond, "the park request is marked done")
	require.Eventually(t, func() bool {
		stuck, err := middleware.StuckInDB(ctx, b.DB, b.Cfg.Topic, 0, time.Minute)
		require.NoError(t, err)
		return len(stuck) == 0
	}, 10*time.Second, 20*time.Millisecond, "the partition moved past the record: not stuck any more")
	require.ErrorContains(t, middleware.RequestPark(ctx, b.DB, req), "parked already")
	require.ErrorContains(t, middleware.RequestPark(ctx, b.DB, middleware.ParkRequest{Topic: b.Cfg.Topic, Offset: 1}),
		"a reason is required")
}
