package event_test

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
)

var update = flag.Bool("update", false, "rewrite golden files")

func sample() event.PurchaseChanged {
	return event.PurchaseChanged{
		PurchaseId:  uuid.MustParse("6f1c2a7e-8a54-4c36-9b9e-0d7f2f0f4a11"),
		TenantId:    uuid.MustParse("0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b"),
		PackageKind: "Top",
		Targets: []event.Target{
			{TargetKind: event.TargetProject, TargetId: uuid.MustParse("11111111-2222-4333-8444-555555555555")},
			{TargetKind: event.TargetPropertyObject, TargetId: uuid.MustParse("66666666-7777-4888-9999-aaaaaaaaaaaa")},
			{TargetKind: event.TargetPost, TargetId: uuid.MustParse("bbbbbbbb-cccc-4ddd-8eee-ffffffffffff")},
		},
		BoostWeight:   50,
		Status:        event.StatusExpired,
		PaymentStatus: "NotRequired",
		StartsAt:      time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		EndsAt:        time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		Version:       2,
	}
}

func TestContract_GoldenJSON(t *testing.T) {
	got, err := json.MarshalIndent(sample(), "", "  ")
	require.NoError(t, err)
	golden := filepath.Join("testdata", "purchase_changed.v1.golden.json")
	if *update {
		require.NoError(t, os.WriteFile(golden, append(got, '\n'), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(got), "the v1 contract changed: bump the topic version instead")

	parsed, err := event.Parse(want)
	require.NoError(t, err)
	require.Equal(t, sample(), parsed)
}

func TestContract_MessageCarriesHeadersAndKey(t *testing.T) {
	ev := sample()
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.FixedZone("X", 3600))
	msg, err := event.NewMessage(ev, "run-1", at)
	require.NoError(t, err)
	require.NotEmpty(t, msg.UUID)
	require.Equal(t, map[string]string{
		event.HeaderContractVersion: "1",
		event.HeaderEventType:       "PromotionPurchaseChanged",
		event.HeaderAggregateType:   "PromotionPurchase",
		event.HeaderAggregateID:     ev.PurchaseId.String(),
		event.HeaderOccurredAt:      "2026-11-29T09:00:00Z",
		event.HeaderCorrelationID:   "run-1",
		event.HeaderTenantID:        ev.TenantId.String(),
	}, map[string]string(msg.Metadata))
	key, err := event.PartitionKey(event.Topic, msg)
	require.NoError(t, err)
	require.Equal(t, ev.PurchaseId.String(), key)
}

func TestContract_ParseRejectsViolations(t *testing.T) {
	cases := map[string]struct {
		mutate func(*event.PurchaseChanged)
		field  string
	}{
		"empty purchase id": {func(e *event.PurchaseChanged) { e.PurchaseId = uuid.Nil }, "PurchaseId"},
		"version zero":      {func(e *event.PurchaseChanged) { e.Version = 0 }, "Version"},
		"weight too high":   {func(e *event.PurchaseChanged) { e.BoostWeight = 101 }, "BoostWeight"},
		"weight zero":       {func(e *event.PurchaseChanged) { e.BoostWeight = 0 }, "BoostWeight"},
		"unknown status":    {func(e *event.PurchaseChanged) { e.Status = "Paused" }, "Status"},
		"no targets":        {func(e *event.PurchaseChanged) { e.Targets = nil }, "Targets"},
		"unknown kind":      {func(e *event.PurchaseChanged) { e.Targets[0].TargetKind = "Shop" }, "Targets[0].TargetKind"},
		"empty target id":   {func(e *event.PurchaseChanged) { e.Targets[1].TargetId = uuid.Nil }, "Targets[1].TargetId"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ev := sample()
			tc.mutate(&ev)
			raw, err := json.Marshal(ev)
			require.NoError(t, err)
			_, err = event.Parse(raw)
			var ce *event.ContractError
			require.True(t, errors.As(err, &ce), "want ContractError, got %v", err)
			require.Equal(t, tc.field, ce.Field)
		})
	}
	_, err := event.Parse([]byte(`{"PurchaseId": 7`))
	var ce *event.ContractError
	require.ErrorAs(t, err, &ce)
}

// TestContract_SeveralViolationsAreEachNamedOnce: a payload that breaks
// several rules fails with one *ContractError that names the first field
// and lists every violation once, behind one "contract violation: ", as the
// DLQ's reason header and promoflow status show it.
func TestContract_SeveralViolationsAreEachNamedOnce(t *testing.T) {
	_, err := event.Parse([]byte(`{"PurchaseId":"6f1c2a7e-8a54-4c36-9b9e-0d7f2f0f4a11","Targets":[{"TargetKind":"Project",` +
		`"TargetId":"11111111-2222-4333-8444-555555555555"}],"BoostWeight":5,"Status":"Active","PaymentStatus":"NotRequired",` +
		`"StartsAt":"2026-11-01T00:00:00Z","EndsAt":"2026-12-01T00:00:00Z","Version":1}`))
	var ce *event.ContractError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "TenantId", ce.Field)
	require.Equal(t, "contract violation: TenantId: is required\nPackageKind: is required", err.Error())
}
