package boost_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
)

func TestLocks_CountsThePurchaseAndEachDistinctCardTarget(t *testing.T) {
	t.Parallel()
	project, object := uuid.New(), uuid.New()
	ev := event.PurchaseChanged{PurchaseId: uuid.New(), Targets: []event.Target{
		{TargetKind: event.TargetProject, TargetId: project},
		{TargetKind: event.TargetProject, TargetId: project},
		{TargetKind: event.TargetPropertyObject, TargetId: object},
		{TargetKind: event.TargetPost, TargetId: uuid.New()},
	}}
	require.Equal(t, 3, boost.Locks(ev), "the purchase, the project once, the object; a Post takes none")
	ev.Targets = ev.Targets[3:]
	require.Zero(t, boost.Locks(ev), "a Post-only event takes no lock")

	ev.Targets = nil
	for range 6_000 {
		ev.Targets = append(ev.Targets, event.Target{TargetKind: event.TargetProject, TargetId: uuid.New()},
			event.Target{TargetKind: event.TargetPropertyObject, TargetId: uuid.New()})
	}
	require.Equal(t, 1+16+16, boost.Locks(ev), "12,000 targets share 16 stripes of each kind")
}
