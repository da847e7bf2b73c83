package sqlmigrate

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// SchemaTooNewError is a schema that a contract migration made unfit for
// this release: its compatible_from is above the release's version.
type SchemaTooNewError struct {
	Release   string // this binary's version
	Needs     string // the schema's greatest compatible_from
	Migration string // the applied migration that set it
}

func (e *SchemaTooNewError) Error() string {
	return fmt.Sprintf("this is promoflow %s; the schema needs %s or later (migration %s is a contract migration): "+
		"run a newer release, or restore the database from before that migration", e.Release, e.Needs, e.Migration)
}

// SchemaBehindError is a schema that lacks migrations this release embeds:
// its statements would fail on the tables and columns they add.
type SchemaBehindError struct {
	Missing []string // the embedded migrations not applied, in order
	// Empty says the database has no migrations table at all.
	Empty bool
}

func (e *SchemaBehindError) Error() string {
	const todo = ": run `promoflow migrate up` with this release first"
	if e.Empty {
		return fmt.Sprintf("the database has no promoflow schema (no migrations table; this release needs %d migrations)%s", len(e.Missing), todo)
	}
	names := e.Missing
	if len(names) > 3 {
		names = append(names[:3:3], "...")
	}
	return fmt.Sprintf("the schema lacks %d migrations this release needs (%s)%s", len(e.Missing), strings.Join(names, ", "), todo)
}

// Check tells whether a release of version may run on the database's schema:
// a SchemaTooNewError when a contract migration applied there needs a later
// release, a SchemaBehindError when the schema lacks a migration the release
// embeds. Migrations the release does not know (a newer release's expand
// migrations) are fine. It changes nothing.
func Check(ctx context.Context, db *sql.DB, version string) error {
	release, err := parseSemver(version)
	if err != nil {
		return fmt.Errorf("this release's %w", err)
	}
	all, err := All()
	if err != nil {
		return err
	}
	var exists, hasColumn bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass('public.promoflow_migrations') IS NOT NULL, (`+compatibleFromExists+`)`).
		Scan(&exists, &hasColumn); err != nil {
		return fmt.Errorf("look up migrations table: %w", err)
	}
	if !exists {
		return &SchemaBehindError{Missing: versions(all), Empty: true}
	}
	query := `SELECT version, '` + baseline + `' FROM public.promoflow_migrations`
	if hasColumn {
		query = `SELECT version, compatible_from FROM public.promoflow_migrations`
	}
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return fmt.Errorf("read applied migrations: %w", err)
	}
	defer rows.Close()
	applied := map[string]bool{}
	var newest *SchemaTooNewError
	var needs semver
	for rows.Next() {
		var v, from string
		if err := rows.Scan(&v, &from); err != nil {
			return err
		}
		applied[v] = true
		parsed, err := parseSemver(from)
		if err != nil {
			return fmt.Errorf("migration %s's compatible_from: %w", v, err)
		}
		if release.less(parsed) && (newest == nil || needs.less(parsed)) {
			newest, needs = &SchemaTooNewError{Release: version, Needs: from, Migration: v}, parsed
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read applied migrations: %w", err)
	}
	if newest != nil {
		return newest
	}
	var missing []string
	for _, m := range all {
		if !applied[m.Version] {
			missing = append(missing, m.Version)
		}
	}
	if len(missing) > 0 {
		return &SchemaBehindError{Missing: missing}
	}
	return nil
}

func versions(all []Migration) []string {
	out := make([]string, len(all))
	for i, m := range all {
		out[i] = m.Version
	}
	return out
}
