package rebuild_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/rebuild"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// buildTable is the table of a build in b's database named for role (its
// unlogged ones: events, tail, sums), "" while it does not exist.
func buildTable(t *testing.T, b *catalogtest.Bundle, role string) string {
	t.Helper()
	var tables []string
	require.NoError(t, b.DB.Select(&tables, `SELECT 'catalog.' || quote_ident(relname) FROM pg_class
		WHERE relnamespace = 'catalog'::regnamespace AND relkind IN ('r', 'p') AND relname ~ ('^rebuild_[0-9a-f]{32}_' || $1 || '$')`,
		role))
	require.LessOrEqual(t, len(tables), 1)
	if len(tables) == 0 {
		return ""
	}
	return tables[0]
}

// unusedRows is how many rows of a build's table the rebuild has not used
// at point at: those of the staged events' slices not loaded yet (the load
// is past its first slice at PointLoad), every row of the others.
func unusedRows(t *testing.T, b *catalogtest.Bundle, table string, at rebuild.Point) int {
	t.Helper()
	query := `SELECT count(*) FROM ` + table
	if first := buildTable(t, b, "events_0"); at == rebuild.PointLoad && first != "" && table == buildTable(t, b, "events") {
		query += ` WHERE tableoid <> '` + first + `'::regclass`
	}
	var n int
	require.NoError(t, b.DB.Get(&n, query))
	return n
}

// lostRebuild is a rebuild of b whose build loses its staging at point at:
// at its ends it sends window events (copied by the catch-up) and, once the
// consumer applied them, reads the live view into *before; at at it calls
// lose.
func lostRebuild(t *testing.T, b *catalogtest.Bundle, h *history, project, object uuid.UUID, at rebuild.Point, before *view,
	lose func()) *rebuild.Rebuilder {
	t.Helper()
	rb := newRebuilderWith(t, b, rebuild.Config{LoadSlice: 4}) // several slices of the history
	seen := map[rebuild.Point]bool{}
	rb.SetHook(func(ctx context.Context, p rebuild.Point) error {
		if seen[p] {
			return nil
		}
		seen[p] = true
		if p == rebuild.PointEnds {
			windowEvents(t, b, h, project, object, 61)
			b.WaitConsumed(t, float64(h.sent()), 30*time.Second)
			v, err := readView(ctx, b, false)
			require.NoError(t, err)
			*before = v
		}
		if p == at {
			lose()
		}
		return nil
	})
	return rb
}

// TestRebuild_StagingLostToACrashIsNeverSwitchedIn: a crash recovery or a
// failover empties a build's unlogged tables (the staged events, the
// catch-up tail, the sums) while database/sql reconnects and the rebuild
// goes on. Each of them is emptied (TRUNCATE, as a crash leaves it) at each
// point of a rebuild of a corrupted projection; and a private PostgreSQL
// server is crashed for real (pg_ctl restart -m immediate) once the sums are
// computed. Wherever the rebuild still needed the rows it lost, it fails with
// a *boost.LostError and the live projection is exactly as it was; where it
// no longer needed them, it switches in the model of the events. Either way,
// the next rebuild succeeds and ends equal to the model.
func TestRebuild_StagingLostToACrashIsNeverSwitchedIn(t *testing.T) {
	t.Parallel()
	t.Run("truncated", func(t *testing.T) {
		b, h, projects, objects := corruptedAfterHistory(t)
		// Where the rebuild still reads a table after the point: emptying it
		// there loses rows it needs, if the table held any it had not used.
		later := map[string]bool{"events@read": true, "events@load": true, "sums@load": true, "sums@compute": true,
			"sums@catch-up": true, "sums@switch-locked": true, "tail@catch-up": true}
		first, lost := true, 0
		for _, role := range []string{"events", "tail", "sums"} {
			for _, at := range []rebuild.Point{rebuild.PointRead, rebuild.PointLoad, rebuild.PointCompute, rebuild.PointCatchUp,
				rebuild.PointSwitchLocked} {
				name := role + "@" + string(at)
				// Each case leaves the projection to the next: stop at the first that fails.
				if !t.Run(name, func(t *testing.T) {
					if !first {
						corrupt(t, b, h)
					}
					first = false
					var before view
					unused := 0
					rb := lostRebuild(t, b, h, projects[0], objects[0], at, &before, func() {
						if table := buildTable(t, b, role); table != "" {
							unused = unusedRows(t, b, table, at)
							_, err := b.DB.Exec(`TRUNCATE ` + table)
							require.NoError(t, err)
						}
					})
					st, err := rb.Run(context.Background())
					requireLostOrModel(t, b, h, st, err, before, later[name] && unused > 0)
					if err != nil {
						lost++
					}
					requireNextRebuildSucceeds(t, b, h)
				}) {
					t.FailNow()
				}
			}
		}
		// events@read, sums@compute, sums@catch-up, sums@switch-locked and
		// tail@catch-up lose rows whatever the slices hold.
		require.GreaterOrEqual(t, lost, 5, "cases in which the rebuild lost rows it needed")
	})
	t.Run("crash", func(t *testing.T) {
		t.Parallel()
		srv := pgtest.StartServer(t, pgtest.ServerOptions{Settings: map[string]string{"synchronous_commit": "on"}})
		b := catalogtest.NewOn(t, srv.URL("sslmode=disable"), true)
		projects, objects := cards(t, b)
		b.Start(t)
		h := &history{}
		produceHistory(t, b, h, projects, objects, 12)
		corrupt(t, b, h)
		var before view
		rb := lostRebuild(t, b, h, projects[0], objects[0], rebuild.PointCompute, &before, func() { srv.Crash(t) })
		st, err := rb.Run(context.Background())
		requireLostOrModel(t, b, h, st, err, before, true)
		requireNextRebuildSucceeds(t, b, h)
	})
}

// requireLostOrModel checks a rebuild whose staging was emptied: when it
// still needed what it lost, it failed with a *boost.LostError and the live
// projection is before; otherwise it is done and the projection is the model.
func requireLostOrModel(t *testing.T, b *catalogtest.Bundle, h *history, st rebuild.Status, err error, before view, needed bool) {
	t.Helper()
	if !needed {
		require.NoError(t, err, "the rebuild no longer needed what it lost")
		require.Equal(t, rebuild.StateDone, st.State)
		requireModel(t, b, h, "after a rebuild that lost what it no longer needed")
		return
	}
	require.Error(t, err, "the rebuild lost rows it needed, and switched: %+v", st)
	require.True(t, boost.IsLost(err), "the rebuild fails as one that lost its staging: %v", err)
	require.ErrorContains(t, err, "the live projection is as it was")
	require.Equal(t, rebuild.StateFailed, st.State)
	requireView(t, b, before, fmt.Sprintf("after a rebuild that lost its staging (%v)", err))
}

// requireNextRebuildSucceeds runs a rebuild and checks it ends equal to the
// model, leaving no table behind.
func requireNextRebuildSucceeds(t *testing.T, b *catalogtest.Bundle, h *history) {
	t.Helper()
	st, err := newRebuilder(t, b).Run(context.Background())
	require.NoError(t, err, "the next rebuild")
	require.Equal(t, rebuild.StateDone, st.State)
	requireModel(t, b, h, "after the next rebuild")
	requireNoBuildTables(t, b)
}
