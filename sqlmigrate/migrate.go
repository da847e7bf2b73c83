// Package sqlmigrate holds the schema's history as embedded, numbered SQL files
// and applies the missing ones, and opens the database as every process does
// (Open). Migrations are never applied by hand.
package sqlmigrate

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"
)

//go:embed migrations/*.sql
var files embed.FS

// lockKey is the transaction-scoped advisory lock key that serialises
// migrators, so that processes starting at once apply each migration exactly once.
const lockKey = 7_301_914_221

// Migration is one embedded SQL file.
type Migration struct {
	Version string // file name without .sql, e.g. 0001_promotion_purchases
	SQL     string
	// Kind is what its first line declares: expand or contract.
	Kind Kind
	// CompatibleFrom is the oldest release that runs on the schema once it is
	// applied: a contract migration's header names it, an expand migration
	// keeps the one before it (0.1.0 for the first).
	CompatibleFrom string
}

// All returns every embedded migration in version order; a file whose first
// line declares no kind fails it (HeaderError).
func All() ([]Migration, error) {
	names, err := fs.Glob(files, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([]Migration, 0, len(names))
	compatibleFrom := baseline
	for _, name := range names {
		body, err := files.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		version := strings.TrimSuffix(strings.TrimPrefix(name, "migrations/"), ".sql")
		kind, from, err := parseHeader(version, string(body), compatibleFrom)
		if err != nil {
			return nil, err
		}
		compatibleFrom = from
		out = append(out, Migration{Version: version, SQL: string(body), Kind: kind, CompatibleFrom: from})
	}
	return out, nil
}

// Up applies every migration that the database lacks and returns the versions
// it applied. Each runs in a transaction of its own that first takes a
// transaction-scoped advisory lock and checks again that the migration is
// missing: migrators starting at once apply each migration exactly once, and
// no lock outlives its transaction, so Up works as well through a pooler in
// transaction mode (a session lock there would stay with whichever server
// connection took it).
func Up(ctx context.Context, db *sql.DB) ([]string, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	if err := inLockedTx(ctx, db, "create migrations table", func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS public.promoflow_migrations (
			version text PRIMARY KEY,
			applied_at timestamptz NOT NULL DEFAULT now())`)
		return err
	}); err != nil {
		return nil, err
	}
	done, err := appliedVersions(ctx, db)
	if err != nil {
		return nil, err
	}
	var applied []string
	for _, m := range all {
		if done[m.Version] {
			continue
		}
		ran := false
		if err := inLockedTx(ctx, db, "apply "+m.Version, func(tx *sql.Tx) error {
			var exists bool
			if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM public.promoflow_migrations WHERE version = $1)`,
				m.Version).Scan(&exists); err != nil || exists {
				return err // another migrator applied it meanwhile
			}
			if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
				return err
			}
			ran = true
			return record(ctx, tx, m)
		}); err != nil {
			return applied, err
		}
		if ran {
			applied = append(applied, m.Version)
		}
	}
	return applied, nil
}

// record writes m into the migrations table, with its compatible_from once
// the table has that column (0021_migrations_compatible_from adds it).
func record(ctx context.Context, tx *sql.Tx, m Migration) error {
	var hasColumn bool
	if err := tx.QueryRowContext(ctx, compatibleFromExists).Scan(&hasColumn); err != nil {
		return fmt.Errorf("look up compatible_from: %w", err)
	}
	if !hasColumn {
		_, err := tx.ExecContext(ctx, `INSERT INTO public.promoflow_migrations (version) VALUES ($1)`, m.Version)
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO public.promoflow_migrations (version, compatible_from) VALUES ($1, $2)`,
		m.Version, m.CompatibleFrom)
	return err
}

// compatibleFromExists says whether the migrations table has its
// compatible_from column.
const compatibleFromExists = `SELECT EXISTS (SELECT 1 FROM information_schema.columns
	WHERE table_schema = 'public' AND table_name = 'promoflow_migrations' AND column_name = 'compatible_from')`

// inLockedTx runs fn in a transaction that holds the migrators' lock.
func inLockedTx(ctx context.Context, db *sql.DB, what string, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("%s: begin: %w", what, err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey); err != nil {
		return fmt.Errorf("%s: take migration lock: %w", what, err)
	}
	if err := fn(tx); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%s: commit: %w", what, err)
	}
	return nil
}

// HoldMigrationsTx holds migrations back until tx ends: it takes the
// migrators' lock shared, so a migrator's transaction waits for tx, and tx
// waits for a migration under way (for as long as its lock_timeout allows).
// A projection rebuild's switch takes it first thing, before any table lock
// (so that it never waits for a migration while it holds one), and checks
// under it that the live tables are still those its build copied: a migration
// that ran during the build makes the switch refuse, and one that starts
// during the switch waits for it.
func HoldMigrationsTx(ctx context.Context, tx interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}) error {
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock_shared($1)`, lockKey); err != nil {
		return fmt.Errorf("hold migrations back: %w", err)
	}
	return nil
}

// Status lists every embedded migration with whether the database has it.
func Status(ctx context.Context, db *sql.DB) (map[string]bool, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass('public.promoflow_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("look up migrations table: %w", err)
	}
	done := map[string]bool{}
	if exists {
		if done, err = appliedVersions(ctx, db); err != nil {
			return nil, err
		}
	}
	out := make(map[string]bool, len(all))
	for _, m := range all {
		out[m.Version] = done[m.Version]
	}
	return out, nil
}

func appliedVersions(ctx context.Context, db *sql.DB) (map[string]bool, error) {
	rows, err := db.QueryContext(ctx, `SELECT version FROM public.promoflow_migrations`)
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	defer rows.Close()
	done := map[string]bool{}
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		done[v] = true
	}
	return done, rows.Err()
}
