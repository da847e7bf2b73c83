package rebuild_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/logtest"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
	"github.com/promoflow/promoflow/router/rebuild"
)

// recordOf finds the record of purchase id at version on topic.
func recordOf(t *testing.T, topic string, id uuid.UUID, version int64, total int) *sarama.ConsumerMessage {
	t.Helper()
	for _, rec := range kafkatest.ReadTopic(t, topic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= total }) {
		if ev, err := event.Parse(rec.Value); err == nil && ev.PurchaseId == id && ev.Version == version {
			return rec
		}
	}
	t.Fatalf("no record of purchase %s v%d on %s", id, version, topic)
	return nil
}

// TestRebuild_ARecordPostgresRefusesIsSkippedAndReported: one record of the
// topic, the removal (v2) of an active purchase, has a row PostgreSQL
// refuses (handed to the loader below the parser: RefusedByPostgres). The
// rebuild does not abort: it leaves that record out, as the consumer
// dead-letters it, copies every other record of its chunk, counts it, logs
// it with its partition and offset, and names it in its status; the
// projection is the model of every other record (the purchase stays active
// at v1).
func TestRebuild_ARecordPostgresRefusesIsSkippedAndReported(t *testing.T) {
	b := setup(t)
	projects, objects := cards(t, b)
	b.Start(t)
	h := &history{}
	produceHistory(t, b, h, projects, objects, 12)
	victim := catalogtest.PurchaseEvent(event.StatusActive, 1, 33, catalogtest.Target(event.TargetProject, projects[0]))
	h.produce(t, b, victim)
	removed := victim
	removed.Status, removed.Version = event.StatusCancelled, 2
	b.Produce(t, removed) // on the topic, out of the model: its row is refused
	b.WaitConsumed(t, float64(h.sent()+1), 30*time.Second)
	rec := recordOf(t, b.Cfg.Topic, victim.PurchaseId, 2, h.sent()+1)

	var logs logtest.Logs
	rb := newRebuilderWith(t, b, rebuild.Config{Log: logs.Logger()})
	rb.SetCheck(catalogtest.RefusedByPostgres(victim.PurchaseId, 2))
	st, err := rb.Run(context.Background())

	require.NoError(t, err, "a record PostgreSQL refuses does not abort the rebuild")
	require.Equal(t, rebuild.StateDone, st.State)
	require.EqualValues(t, h.sent()+1, st.Read)
	require.Zero(t, st.Skipped, "no record breaks the contract")
	require.EqualValues(t, 1, st.Refused)
	require.Len(t, st.RefusedRecords, 1)
	require.Equal(t, rec.Partition, st.RefusedRecords[0].Partition)
	require.Equal(t, rec.Offset, st.RefusedRecords[0].Offset)
	require.Equal(t, "22008", st.RefusedRecords[0].Code)
	require.Contains(t, st.RefusedRecords[0].Reason, "out of range")
	saved, err := newRebuilder(t, b).Status(context.Background())
	require.NoError(t, err)
	require.Equal(t, st.RefusedRecords, saved.RefusedRecords, "the status other processes read names it too")
	require.EqualValues(t, 1, saved.Refused)
	logged := logs.Find(slog.LevelWarn, "rebuild skipped a record PostgreSQL refused")
	require.Len(t, logged, 1, "logged once")
	require.Equal(t, fmt.Sprint(rec.Partition), logged[0]["partition"])
	require.Equal(t, fmt.Sprint(rec.Offset), logged[0]["offset"])
	require.Equal(t, "22008", logged[0]["code"])
	requireModel(t, b, h, "after a rebuild that left out the refused record")
}
