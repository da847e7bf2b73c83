package audit_test

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
	"github.com/promoflow/promoflow/router/audit"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/kafkakit/kafkatest"
)

// TestAuditReplica_ARecordPostgresRefusesIsSkippedAndReported: the removal
// (v2) of a purchase has a row PostgreSQL refuses (a time out of its range,
// handed to the loader below the parser); the consumer dead-letters such a
// record, so the replica stays at v1 (RefusedByPostgres). The replica check does not abort: it
// leaves the record out, counts it, logs it and names it in its report by
// partition and offset, and finds the replica in order.
func TestAuditReplica_ARecordPostgresRefusesIsSkippedAndReported(t *testing.T) {
	t.Parallel()
	b := catalogtest.New(t, true)
	project := uuid.New()
	b.ProjectCard(t, project)
	stop := b.Start(t)
	ev := catalogtest.PurchaseEvent(event.StatusActive, 1, 7, catalogtest.Target(event.TargetProject, project))
	b.Produce(t, ev)
	b.WaitBoost(t, event.TargetProject, project, 7)
	stop() // the consumer would dead-letter the next record: it never reaches the replica
	removed := ev
	removed.Status, removed.Version = event.StatusCancelled, 2
	b.Produce(t, removed)
	var rec *sarama.ConsumerMessage
	for _, r := range kafkatest.ReadTopic(t, b.Cfg.Topic, 30*time.Second, func(ms []*sarama.ConsumerMessage) bool { return len(ms) >= 2 }) {
		if parsed, err := event.Parse(r.Value); err == nil && parsed.Version == 2 {
			rec = r
		}
	}
	require.NotNil(t, rec)

	var logs logtest.Logs
	a, err := audit.New(audit.Config{DB: b.DB, Kafka: b.Cfg.Kafka, Topic: b.Cfg.Topic, ConsumerGroup: b.Cfg.ConsumerGroup,
		Log: logs.Logger()})
	require.NoError(t, err)
	a.SetCheck(catalogtest.RefusedByPostgres(ev.PurchaseId, 2))
	rep, err := a.Replica(context.Background())

	require.NoError(t, err, "a record PostgreSQL refuses does not abort the check")
	require.EqualValues(t, 1, rep.Refused)
	require.Len(t, rep.RefusedRecords, 1)
	require.Equal(t, rec.Partition, rep.RefusedRecords[0].Partition)
	require.Equal(t, rec.Offset, rep.RefusedRecords[0].Offset)
	require.Equal(t, "22008", rep.RefusedRecords[0].Code)
	require.Zero(t, rep.Drifted, "%v", rep.Samples)
	require.EqualValues(t, 1, rep.Purchases)
	logged := logs.Find(slog.LevelWarn, "audit skipped a record PostgreSQL refused")
	require.Len(t, logged, 1)
	require.Equal(t, fmt.Sprint(rec.Offset), logged[0]["offset"])
}
