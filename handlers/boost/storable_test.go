package boost_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// FuzzParse_AcceptedEventsAreStorable: every event that event.Parse accepts
// is stored by the consumer's apply statement (prepared, and as plain SQL
// when prepared statements are off) and by the staging COPY of a rebuild or
// an audit, each with its EndsAt as the same instant, to the microsecond
// PostgreSQL keeps. A value that the contract lets through and PostgreSQL
// refuses (a year 0000, an offset past ±15:59) is dead-lettered by the
// consumer and aborts every rebuild for as long as the compacted topic keeps
// it.
//
// The fuzzer varies the value of each member of a payload (Targets as raw
// JSON), because a whole payload's bytes mutated at random almost never
// parse: in a 15 s trial none did but the seeds, of 176,000 inputs, where
// members mutated gave 700 accepted events of 50,000. The payload's syntax
// is FuzzParse_AgreesWithTheSchema's. Each input's applies run in one
// transaction on the one connection, rolled back; its staging row is copied
// as a rebuild copies (a chunk committed by the loader), then deleted.
func FuzzParse_AcceptedEventsAreStorable(f *testing.F) {
	for _, in := range storableSeeds() {
		f.Add(in.PurchaseId, in.TenantId, in.PackageKind, in.Targets, in.BoostWeight, in.Status, in.PaymentStatus,
			in.StartsAt, in.EndsAt, in.Version)
	}
	ctx := context.Background()
	db := pgtest.DB(f)
	db.SetMaxOpenConns(1)
	prepared, err := boost.Prepare(ctx, db)
	require.NoError(f, err)
	f.Cleanup(func() { prepared.Close() })
	appliers := []struct {
		name  string
		apply func(context.Context, *sqlx.Tx, []event.PurchaseChanged) ([]boost.Outcome, error)
	}{{"the prepared apply statement", prepared.ApplyBatch}, {"the apply statement", boost.ApplyBatch}}
	staging := boost.StagingTable("storable_events")
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(f, err)
	require.NoError(f, staging.CreateTx(ctx, tx))
	require.NoError(f, tx.Commit())

	f.Fuzz(func(t *testing.T, purchaseID, tenantID, packageKind, targets string, boostWeight int64,
		status, paymentStatus, startsAt, endsAt string, version int64) {
		payload, ok := storableInput{purchaseID, tenantID, packageKind, targets, boostWeight, status, paymentStatus,
			startsAt, endsAt, version}.payload()
		if !ok {
			return
		}
		ev, err := event.Parse(payload)
		if err != nil {
			return
		}
		rows := 0 // each distinct card target; none for Post targets only
		if n := boost.Locks(ev); n > 0 {
			rows = n - 1
		}
		tx, err := db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback() //nolint:errcheck // rolled back below

		for _, a := range appliers {
			_, err := tx.ExecContext(ctx, `SAVEPOINT apply`)
			require.NoError(t, err)
			if _, err := a.apply(ctx, tx, []event.PurchaseChanged{ev}); err != nil {
				t.Fatalf("%s refuses an accepted event: %v\n%s", a.name, err, payload)
			}
			requireStoredAt(t, tx, ev.EndsAt, rows, a.name,
				`SELECT ends_at FROM catalog.promotion_contributions WHERE purchase_id = $1`, ev.PurchaseId)
			_, err = tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT apply`)
			require.NoError(t, err)
		}

		require.NoError(t, tx.Rollback())

		loader, err := staging.NewLoader(ctx, boost.LoaderConfig{DB: db, Skipped: func(_ int32, _ int64, violation error) {
			t.Errorf("the staging loader skips an accepted event: %v\n%s", violation, payload)
		}})
		require.NoError(t, err)
		defer db.MustExec(`DELETE FROM ` + staging.String())
		if err := loader.Add(0, 0, []byte(ev.PurchaseId.String()), payload); err != nil {
			t.Fatalf("the staging COPY refuses an accepted event: %v\n%s", err, payload)
		}
		if err := loader.Close(); err != nil {
			t.Fatalf("the staging COPY refuses an accepted event: %v\n%s", err, payload)
		}
		staged := min(rows, 1) // one row per event with card targets
		requireStoredAt(t, db, ev.EndsAt, staged, "the staging COPY",
			`SELECT ends_at FROM `+staging.String()+` WHERE purchase_id = $1`, ev.PurchaseId)
	})
}

// requireStoredAt checks that query (of one timestamptz column, ends_at)
// returns rows rows, each the instant want to the microsecond: PostgreSQL
// rounds the nanoseconds the contract allows to the nearest microsecond.
func requireStoredAt(t *testing.T, q sqlx.Queryer, want time.Time, rows int, by, query string, args ...any) {
	t.Helper()
	// The epoch in microseconds, computed by PostgreSQL: a time.Time read
	// back would go through lib/pq's parser of years BC as well.
	var stored []int64
	require.NoError(t, sqlx.Select(q, &stored,
		`SELECT (extract(epoch FROM ends_at) * 1000000)::bigint FROM (`+query+`) q`, args...))
	if len(stored) != rows {
		t.Fatalf("%s stored %d rows of an accepted event, want %d (EndsAt %s)", by, len(stored), rows, want.Format(time.RFC3339Nano))
	}
	for _, us := range stored {
		// The distance in nanoseconds from want's second (int64 nanoseconds
		// since 1970 do not reach the years 1 or 9999).
		off := (us-want.Unix()*1_000_000)*1000 - int64(want.Nanosecond())
		if off < -500 || off > 500 {
			t.Fatalf("%s stored EndsAt %s as %s: %d ns away", by, want.Format(time.RFC3339Nano),
				time.UnixMicro(us).UTC().Format(time.RFC3339Nano), off)
		}
	}
}

// storableInput is one input of FuzzParse_AcceptedEventsAreStorable: the
// value of each member of a payload, Targets as raw JSON.
type storableInput struct {
	PurchaseId, TenantId, PackageKind, Targets string
	BoostWeight                                int64
	Status, PaymentStatus, StartsAt, EndsAt    string
	Version                                    int64
}

// payload is the JSON object of in; ok is false when Targets is not JSON.
func (in storableInput) payload() (raw []byte, ok bool) {
	raw, err := json.Marshal(map[string]any{"PurchaseId": in.PurchaseId, "TenantId": in.TenantId,
		"PackageKind": in.PackageKind, "Targets": json.RawMessage(in.Targets), "BoostWeight": in.BoostWeight,
		"Status": in.Status, "PaymentStatus": in.PaymentStatus, "StartsAt": in.StartsAt, "EndsAt": in.EndsAt,
		"Version": in.Version})
	return raw, err == nil
}

// storableSeeds are accepted events at the bounds of what PostgreSQL stores
// (the years 0001 and 9999, the widest offsets either way, the instants
// those reach in UTC, nanoseconds that round to the next second), values no
// column holds (a NUL in PackageKind or PaymentStatus), and times just past
// those bounds, which the contract refuses.
func storableSeeds() []storableInput {
	base := storableInput{
		PurchaseId: "6f1c2a7e-8a54-4c36-9b9e-0d7f2f0f4a11", TenantId: "0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b",
		PackageKind: "Top", BoostWeight: 50, Status: "Active", PaymentStatus: "NotRequired",
		StartsAt: "2026-11-01T00:00:00Z", EndsAt: "2026-12-01T00:00:00Z", Version: 2,
		Targets: `[{"TargetKind":"Project","TargetId":"11111111-2222-4333-8444-555555555555"},` +
			`{"TargetKind":"PropertyObject","TargetId":"66666666-7777-4888-9999-aaaaaaaaaaaa"},` +
			`{"TargetKind":"Post","TargetId":"bbbbbbbb-cccc-4ddd-8eee-ffffffffffff"}]`,
	}
	out := []storableInput{base}
	with := func(set func(in *storableInput, v string), values ...string) {
		for _, v := range values {
			in := base
			set(&in, v)
			out = append(out, in)
		}
	}
	endsAt := func(in *storableInput, v string) { in.EndsAt = v }
	// Stored: the bounds of the contract.
	with(endsAt, "0001-01-01T00:00:00Z", "0001-01-01T00:00:00+15:59", "0001-01-01T00:00:00-15:59",
		"0001-01-01T15:58:59+15:59", "9999-12-31T23:59:59.999999999Z", "9999-12-31T23:59:59.999999999-15:59",
		"9999-12-31T23:59:59.999999999+15:59", "2026-11-01T00:00:00+15:59", "2026-11-01T00:00:00-15:59",
		"2026-11-01T00:00:00+00:00", "2026-11-01T00:00:00-00:00", "2026-11-01T23:59:59.9999995Z",
		"2026-11-01T00:00:00.0000005Z", "2028-02-29T12:00:00+15:00")
	// Refused: just past them.
	with(endsAt, "0000-12-31T23:59:59.999999999Z", "0000-01-01T00:00:00+15:59", "2026-11-01T00:00:00+16:00",
		"2026-11-01T00:00:00-16:00", "2026-11-01T00:00:00+23:59", "10000-01-01T00:00:00Z")
	with(func(in *storableInput, v string) { in.StartsAt = v },
		"0001-01-01T00:00:00+15:59", "9999-12-31T23:59:59.999999999-15:59", "0000-01-01T00:00:00Z")
	with(func(in *storableInput, v string) { in.Status = v }, "Pending", "Expired", "Cancelled")
	with(func(in *storableInput, v string) { in.PackageKind = v }, "\x00", "Top\x00", "")
	with(func(in *storableInput, v string) { in.PaymentStatus = v }, "\x00")
	with(func(in *storableInput, v string) { in.Targets = v },
		`[{"TargetKind":"Post","TargetId":"bbbbbbbb-cccc-4ddd-8eee-ffffffffffff"}]`,
		`[{"TargetKind":"Project","TargetId":"11111111-2222-4333-8444-555555555555"},`+
			`{"TargetKind":"Project","TargetId":"11111111-2222-4333-8444-555555555555"},`+
			`{"TargetKind":"PropertyObject","TargetId":"11111111-2222-4333-8444-555555555555"}]`)
	for _, n := range []int64{1, 100} {
		in := base
		in.BoostWeight = n
		out = append(out, in)
	}
	in := base
	in.Version = 9223372036854775807
	return append(out, in)
}
