package purchase_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/purchase"
)

func draft() purchase.Draft {
	now := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	return purchase.Draft{PackageKind: "Top", BoostWeight: 10, StartsAt: now, EndsAt: now.Add(time.Hour),
		Targets: []event.Target{{TargetKind: event.TargetProject, TargetId: uuid.New()}}}
}

func TestDraft_ValidateNamesEveryBadField(t *testing.T) {
	d := draft()
	d.BoostWeight = 0
	d.EndsAt = d.StartsAt
	d.Targets = append(d.Targets, d.Targets[0], event.Target{TargetKind: "Shop", TargetId: uuid.Nil})
	var ve *purchase.ValidationError
	require.True(t, errors.As(d.Validate(), &ve))
	fields := map[string]bool{}
	for _, f := range ve.Fields {
		fields[f.Field] = true
	}
	for _, want := range []string{"BoostWeight", "EndsAt", "Targets[1]", "Targets[2].TargetKind", "Targets[2].TargetId"} {
		require.True(t, fields[want], "missing %s in %v", want, ve.Fields)
	}
	require.NoError(t, draft().Validate())
}

// TestDraft_TimesOutsideTheContractAreRefused: a time whose UTC form is
// before year 1 or after 9999 would make an event that the contract refuses
// (the consumer would dead-letter it) or that cannot be written at all.
func TestDraft_TimesOutsideTheContractAreRefused(t *testing.T) {
	early := time.FixedZone("+01:00", 3600)
	late := time.FixedZone("-05:00", -5*3600)
	for name, d := range map[string]purchase.Draft{
		"StartsAt before year 1 in UTC": func() purchase.Draft {
			d := draft()
			d.StartsAt = time.Date(1, 1, 1, 0, 0, 0, 0, early)
			return d
		}(),
		"EndsAt after 9999 in UTC": func() purchase.Draft {
			d := draft()
			d.EndsAt = time.Date(9999, 12, 31, 23, 0, 0, 0, late)
			return d
		}(),
	} {
		var ve *purchase.ValidationError
		require.True(t, errors.As(d.Validate(), &ve), name)
		field := "StartsAt"
		if d.EndsAt.Year() == 9999 {
			field = "EndsAt"
		}
		require.Equal(t, field, ve.Fields[0].Field, "%s: %v", name, ve.Fields)
	}
	d := draft()
	d.StartsAt, d.EndsAt = time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
	require.NoError(t, d.Validate(), "the contract's first and last times")
}

func TestPurchase_NoPaymentModeIsActiveAtOnceAtVersionOne(t *testing.T) {
	now := time.Date(2026, 11, 29, 10, 0, 0, 123456789, time.UTC)
	p := purchase.NewActive(uuid.New(), uuid.New(), draft(), now)
	require.Equal(t, event.StatusActive, p.Status)
	require.Equal(t, purchase.PaymentNotRequired, p.PaymentStatus)
	require.EqualValues(t, 1, p.Version)
	require.NoError(t, p.Check())
}

func TestPurchase_TerminalStatusesTakeNoTransition(t *testing.T) {
	now := time.Now().UTC()
	p := purchase.NewActive(uuid.New(), uuid.New(), draft(), now)
	require.NoError(t, p.Expire(now))
	require.Equal(t, event.StatusExpired, p.Status)
	require.EqualValues(t, 2, p.Version)
	require.Equal(t, now, p.UpdatedAt)
	require.ErrorIs(t, p.Cancel(now), purchase.ErrTerminal, "INV-6")
	require.ErrorIs(t, p.Expire(now), purchase.ErrNotActive)
	require.EqualValues(t, 2, p.Version, "a refused transition changes nothing")

	c := purchase.NewActive(uuid.New(), uuid.New(), draft(), now)
	require.NoError(t, c.Cancel(now))
	require.ErrorIs(t, c.Cancel(now), purchase.ErrTerminal)
	require.ErrorIs(t, c.Expire(now), purchase.ErrNotActive)
}

func TestPurchase_CheckFlagsAStoredRowThatBreaksTheRules(t *testing.T) {
	p := purchase.NewActive(uuid.New(), uuid.New(), draft(), time.Now())
	p.Targets = nil
	require.Error(t, p.Check())
	p = purchase.NewActive(uuid.New(), uuid.New(), draft(), time.Now())
	p.Status = "Paused"
	require.Error(t, p.Check())
}
