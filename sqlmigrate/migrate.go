// Package sqlmigrate holds the schema's history as embedded, numbered SQL files
// and applies the missing ones. Migrations are never applied by hand.
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

// lockKey is the pg_advisory_lock key that serialises migrators, so that
// processes starting at once apply each migration exactly once.
const lockKey = 7_301_914_221

// Migration is one embedded SQL file.
type Migration struct {
	Version string // file name without .sql, e.g. 0001_promotion_purchases
	SQL     string
}

// All returns every embedded migration in version order.
func All() ([]Migration, error) {
	names, err := fs.Glob(files, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([]Migration, 0, len(names))
	for _, name := range names {
		body, err := files.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		version := strings.TrimSuffix(strings.TrimPrefix(name, "migrations/"), ".sql")
		out = append(out, Migration{Version: version, SQL: string(body)})
	}
	return out, nil
}

// Up applies every migration that the database lacks, each in its own
// transaction, under a session advisory lock. It returns the versions applied.
func Up(ctx context.Context, db *sql.DB) ([]string, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()

	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, lockKey); err != nil {
		return nil, fmt.Errorf("take migration lock: %w", err)
	}
	// Unlock on a fresh context: the caller's may be cancelled by now.
	defer conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, lockKey) //nolint:errcheck

	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS public.promoflow_migrations (
		version text PRIMARY KEY,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("create migrations table: %w", err)
	}
	done, err := appliedVersions(ctx, conn)
	if err != nil {
		return nil, err
	}

	var applied []string
	for _, m := range all {
		if done[m.Version] {
			continue
		}
		if err := apply(ctx, conn, m); err != nil {
			return applied, err
		}
		applied = append(applied, m.Version)
	}
	return applied, nil
}

// Status lists every embedded migration with whether the database has it.
func Status(ctx context.Context, db *sql.DB) (map[string]bool, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	var exists bool
	if err := conn.QueryRowContext(ctx, `SELECT to_regclass('public.promoflow_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("look up migrations table: %w", err)
	}
	done := map[string]bool{}
	if exists {
		if done, err = appliedVersions(ctx, conn); err != nil {
			return nil, err
		}
	}
	out := make(map[string]bool, len(all))
	for _, m := range all {
		out[m.Version] = done[m.Version]
	}
	return out, nil
}

func appliedVersions(ctx context.Context, conn *sql.Conn) (map[string]bool, error) {
	rows, err := conn.QueryContext(ctx, `SELECT version FROM public.promoflow_migrations`)
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

func apply(ctx context.Context, conn *sql.Conn, m Migration) error {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin %s: %w", m.Version, err)
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return fmt.Errorf("apply %s: %w", m.Version, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO public.promoflow_migrations (version) VALUES ($1)`, m.Version); err != nil {
		return fmt.Errorf("record %s: %w", m.Version, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit %s: %w", m.Version, err)
	}
	return nil
}
