package boost_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

type bundle struct {
	db *sqlx.DB
}

func setup(t *testing.T) bundle {
	t.Helper()
	t.Parallel()
	return setupAlone(t)
}

// setupAlone is setup for a test that must not run in parallel (it measures time).
func setupAlone(t *testing.T) bundle {
	t.Helper()
	return bundle{db: pgtest.DB(t)}
}

// inTx runs fn in a transaction of its own and commits it, as the consumer's
// unit-of-work middleware does.
func inTx(ctx context.Context, db *sqlx.DB, fn func(*sqlx.Tx) error) error {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

func (b bundle) applyE(ev event.PurchaseChanged) (boost.Outcome, error) {
	var out boost.Outcome
	err := inTx(context.Background(), b.db, func(tx *sqlx.Tx) error {
		var err error
		out, err = boost.Apply(context.Background(), tx, ev)
		return err
	})
	return out, err
}

func (b bundle) apply(t *testing.T, ev event.PurchaseChanged) boost.Outcome {
	t.Helper()
	out, err := b.applyE(ev)
	require.NoError(t, err)
	return out
}

func (b bundle) upsertProject(t *testing.T, c boost.ProjectCard) {
	t.Helper()
	require.NoError(t, inTx(context.Background(), b.db, func(tx *sqlx.Tx) error {
		return boost.UpsertProjectCardTx(context.Background(), tx, c)
	}))
}

func (b bundle) upsertObject(t *testing.T, c boost.PropertyObjectCard) {
	t.Helper()
	require.NoError(t, inTx(context.Background(), b.db, func(tx *sqlx.Tx) error {
		return boost.UpsertPropertyObjectCardTx(context.Background(), tx, c)
	}))
}

// newProject stores a project card with chessboard data and returns its id.
func (b bundle) newProject(t *testing.T) uuid.UUID {
	t.Helper()
	id := uuid.New()
	b.upsertProject(t, projectCard(id))
	return id
}

// newObject stores a property-object card of project and returns its id.
func (b bundle) newObject(t *testing.T, project uuid.UUID, published bool) uuid.UUID {
	t.Helper()
	id := uuid.New()
	b.upsertObject(t, objectCard(id, project, published))
	return id
}

func projectCard(id uuid.UUID) boost.ProjectCard {
	return boost.ProjectCard{
		ID: id, Title: "Residential complex", Status: "Selling", Visibility: "Public",
		MinPrice: ptr("4500000.50"), PropertyObjectsAvailable: 12, Payback: ptr("7.25"),
	}
}

func objectCard(id, project uuid.UUID, published bool) boost.PropertyObjectCard {
	return boost.PropertyObjectCard{ID: id, ProjectID: project, Published: published, Status: "Free", Price: ptr("5100000.00")}
}

func ptr[T any](v T) *T { return &v }

func (b bundle) projectBoost(t *testing.T, id uuid.UUID) int {
	t.Helper()
	c, err := boost.GetProjectCard(context.Background(), b.db, id)
	require.NoError(t, err)
	return c.PromotionBoost
}

func (b bundle) objectBoost(t *testing.T, id uuid.UUID) int {
	t.Helper()
	c, err := boost.GetPropertyObjectCard(context.Background(), b.db, id)
	require.NoError(t, err)
	return c.PromotionBoost
}

// contribution is one replica row.
type contribution struct {
	BoostWeight int          `db:"boost_weight"`
	Status      event.Status `db:"status"`
	Version     int64        `db:"version"`
	Active      bool         `db:"active"`
}

// contribution reads one replica row; ok is false when there is none.
func (b bundle) contribution(t *testing.T, purchase uuid.UUID, target event.Target) (c contribution, ok bool) {
	t.Helper()
	err := b.db.Get(&c, `SELECT boost_weight, status, version, active FROM catalog.promotion_contributions
		WHERE purchase_id = $1 AND target_kind = $2 AND target_id = $3`, purchase, target.TargetKind, target.TargetId)
	if err == sql.ErrNoRows {
		return c, false
	}
	require.NoError(t, err)
	return c, true
}

func (b bundle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Get(&n, query, args...))
	return n
}

// xmin is the id of the transaction that last wrote a row: it tells whether a
// write happened even when the value written was the same.
func (b bundle) xmin(t *testing.T, table string, id uuid.UUID) string {
	t.Helper()
	var x string
	require.NoError(t, b.db.Get(&x, `SELECT xmin::text FROM `+table+` WHERE id = $1`, id))
	return x
}

// boosts maps every card id to its promotion_boost.
func (b bundle) boosts(t *testing.T) map[uuid.UUID]int {
	t.Helper()
	var rows []struct {
		ID    uuid.UUID `db:"id"`
		Boost int       `db:"promotion_boost"`
	}
	require.NoError(t, b.db.Select(&rows, `SELECT id, promotion_boost FROM catalog.project_cards
		UNION ALL SELECT id, promotion_boost FROM catalog.property_object_cards`))
	out := make(map[uuid.UUID]int, len(rows))
	for _, r := range rows {
		out[r.ID] = r.Boost
	}
	return out
}

func onProject(id uuid.UUID) event.Target {
	return event.Target{TargetKind: event.TargetProject, TargetId: id}
}

func onObject(id uuid.UUID) event.Target {
	return event.Target{TargetKind: event.TargetPropertyObject, TargetId: id}
}

func onPost(id uuid.UUID) event.Target {
	return event.Target{TargetKind: event.TargetPost, TargetId: id}
}

// changed is one PromotionPurchaseChanged as the producer writes it.
func changed(purchase uuid.UUID, status event.Status, weight int, version int64, targets ...event.Target) event.PurchaseChanged {
	ev := event.PurchaseChanged{
		PurchaseId:    purchase,
		TenantId:      uuid.MustParse("0b8e1f3c-2d4a-4e5f-8a6b-7c8d9e0f1a2b"),
		PackageKind:   "Top",
		Targets:       targets,
		BoostWeight:   weight,
		Status:        status,
		PaymentStatus: "NotRequired",
		StartsAt:      time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		EndsAt:        time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		Version:       version,
	}
	if err := ev.Validate(); err != nil {
		panic(err) // Apply's input has passed event.Parse
	}
	return ev
}

// backendPID is the PostgreSQL backend of tx's connection.
func backendPID(t *testing.T, tx *sqlx.Tx) int {
	t.Helper()
	var pid int
	require.NoError(t, tx.Get(&pid, `SELECT pg_backend_pid()`))
	return pid
}

// waitBlocked waits until the backend pid waits for a lock.
func (b bundle) waitBlocked(t *testing.T, pid int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting bool
		err := b.db.Get(&waiting, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid)
		return err == nil && waiting
	}, 10*time.Second, 5*time.Millisecond, "backend %d never waited for a lock", pid)
}

// requireNoDrift checks that every card's boost equals the seed's formula
// recomputed from the replica.
func (b bundle) requireNoDrift(t *testing.T, msgAndArgs ...any) {
	t.Helper()
	drift, err := boost.Drift(context.Background(), b.db)
	require.NoError(t, err)
	require.Empty(t, drift, msgAndArgs...)
}

// wantBoosts is the seed's formula in Go: the boost of every given card from
// the latest applied snapshot of each purchase.
func wantBoosts(applied map[uuid.UUID]event.PurchaseChanged, projects []uuid.UUID, objects map[uuid.UUID]boost.PropertyObjectCard) map[uuid.UUID]int {
	projectSum := map[uuid.UUID]int{}
	objectSum := map[uuid.UUID]int{}
	for _, ev := range applied {
		if ev.Status != event.StatusActive {
			continue
		}
		seen := map[event.Target]bool{}
		for _, tg := range ev.Targets {
			if seen[tg] {
				continue
			}
			seen[tg] = true
			switch tg.TargetKind {
			case event.TargetProject:
				projectSum[tg.TargetId] += ev.BoostWeight
			case event.TargetPropertyObject:
				objectSum[tg.TargetId] += ev.BoostWeight
			}
		}
	}
	want := map[uuid.UUID]int{}
	for _, p := range projects {
		want[p] = projectSum[p]
	}
	for id, c := range objects {
		want[id] = objectSum[id]
		if c.Published {
			want[id] += projectSum[c.ProjectID]
		}
	}
	return want
}
