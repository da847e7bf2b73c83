package rebuild_test

import (
	"context"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/router/catalogtest"
	"github.com/promoflow/promoflow/router/rebuild"
	"github.com/promoflow/promoflow/sqlmigrate"
	"github.com/promoflow/promoflow/sqlmigrate/pgtest"
)

// readerRole makes a role of the test's own, dropped at cleanup with what it
// was granted.
func readerRole(t *testing.T, b *catalogtest.Bundle) string {
	t.Helper()
	role := "pf_reader_" + pgtest.RandomSuffix()
	_, err := b.DB.Exec(`CREATE ROLE ` + role)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = b.DB.Exec(`DROP OWNED BY ` + role)
		_, _ = b.DB.Exec(`DROP ROLE ` + role)
	})
	return role
}

// replicaCarries is what the live replica carries besides its rows: its
// grants to role and its storage options.
type replicaCarries struct {
	Select     bool           `db:"sel"`
	Insert     bool           `db:"ins"`
	Grantable  bool           `db:"grantable"`
	RelOptions pq.StringArray `db:"reloptions"`
}

func carries(t *testing.T, b *catalogtest.Bundle, role string) replicaCarries {
	t.Helper()
	var c replicaCarries
	require.NoError(t, b.DB.Get(&c, `SELECT has_table_privilege($1, 'catalog.promotion_contributions', 'SELECT') AS sel,
			has_table_privilege($1, 'catalog.promotion_contributions', 'INSERT') AS ins,
			has_table_privilege($1, 'catalog.promotion_contributions', 'INSERT WITH GRANT OPTION') AS grantable,
			(SELECT reloptions FROM pg_class WHERE oid = 'catalog.promotion_contributions'::regclass) AS reloptions`, role))
	return c
}

// TestRebuild_SwitchKeepsGrantsAndRefusesAChangedTable: the live replica
// carries grants to another role and storage options, which a table made
// LIKE it does not copy: after the switch the new live replica has them all.
// A migration that adds a column, or a constraint, to the live replica while
// a rebuild builds the new one makes the switch refuse with a
// *boost.ChangedError naming what differs, leaving the live projection (and
// the migration's change) as they were; the next rebuild, made like the
// changed table, switches. A migration that starts while the switch runs
// waits for it to commit.
func TestRebuild_SwitchKeepsGrantsAndRefusesAChangedTable(t *testing.T) {
	b, h, _, _ := corruptedAfterHistory(t)
	role := readerRole(t, b)
	_, err := b.DB.Exec(`GRANT SELECT ON catalog.promotion_contributions TO ` + role + `;
		GRANT INSERT ON catalog.promotion_contributions TO ` + role + ` WITH GRANT OPTION;
		ALTER TABLE catalog.promotion_contributions SET (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.01)`)
	require.NoError(t, err)
	want := carries(t, b, role)
	require.Equal(t, replicaCarries{Select: true, Insert: true, Grantable: true,
		RelOptions: pq.StringArray{"fillfactor=90", "autovacuum_vacuum_scale_factor=0.01"}}, want)

	st, err := newRebuilder(t, b).Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, rebuild.StateDone, st.State)
	require.Equal(t, want, carries(t, b, role), "the new live replica has the old one's grants and storage options")
	requireModel(t, b, h, "after the switch")

	for _, change := range []struct{ what, ddl string }{
		{"columns", `ALTER TABLE catalog.promotion_contributions ADD COLUMN note text`},
		{"constraints", `ALTER TABLE catalog.promotion_contributions ADD CONSTRAINT weight_within_contract CHECK (boost_weight <= 100)`},
	} {
		corrupt(t, b, h)
		before, err := readView(t.Context(), b, false)
		require.NoError(t, err)
		rb := newRebuilder(t, b)
		rb.SetHook(func(_ context.Context, at rebuild.Point) error {
			if at == rebuild.PointCompute { // the new replica made LIKE the live one
				_, err := b.DB.Exec(change.ddl)
				require.NoError(t, err)
			}
			return nil
		})
		st, err := rb.Run(context.Background())
		var changed *boost.ChangedError
		require.ErrorAs(t, err, &changed, "a rebuild whose live replica a migration changed: %+v", st)
		require.Equal(t, change.what, changed.What)
		require.ErrorContains(t, err, "nothing was switched")
		require.Equal(t, rebuild.StateFailed, st.State)
		requireView(t, b, before, "after the switch refused the "+change.what+" a migration changed")
		require.Equal(t, want, carries(t, b, role))

		requireNextRebuildSucceeds(t, b, h)
		require.Equal(t, want, carries(t, b, role))
	}
	var note bool
	require.NoError(t, b.DB.Get(&note, `SELECT EXISTS (SELECT FROM pg_attribute
		WHERE attrelid = 'catalog.promotion_contributions'::regclass AND attname = 'note' AND NOT attisdropped)`))
	require.True(t, note, "the migration's column is kept")

	// A migration that starts while the switch holds the projection waits.
	migrated := make(chan error, 1)
	rb := newRebuilder(t, b)
	started := false
	rb.SetHook(func(ctx context.Context, at rebuild.Point) error {
		if at != rebuild.PointSwitchLocked || started {
			return nil
		}
		started = true
		go func() {
			_, err := sqlmigrate.Up(context.Background(), b.DB.DB)
			migrated <- err
		}()
		require.Eventually(t, func() bool {
			var waiting bool
			return b.DB.Get(&waiting, `SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
				AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`) == nil && waiting
		}, 30*time.Second, 5*time.Millisecond, "a migration that starts during the switch waits for it")
		select {
		case err := <-migrated:
			t.Fatalf("the migration ran during the switch: %v", err)
		default:
		}
		return nil
	})
	st, err = rb.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, rebuild.StateDone, st.State)
	select {
	case err := <-migrated:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the migration did not run once the switch committed")
	}
}
