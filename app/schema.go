package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/sqlmigrate"
)

// Migrations are an explicit step of a release (`promoflow migrate up`,
// docs/operations.md): a process only checks that the schema fits it.

const migrateOnStartUsage = "apply missing migrations at start (safe with several processes); " +
	"off: run `promoflow migrate up` with the new release before its processes start (docs/operations.md)"

// schemaCheckInterval is how long /readyz keeps the schema's verdict: a
// contract migration that a newer release applies turns it false within it.
const schemaCheckInterval = 10 * time.Second

// checkSchema refuses a schema that this release cannot write to: one a
// newer release's contract migration changed, or one that lacks a migration
// this release embeds (sqlmigrate.Check).
func checkSchema(ctx context.Context, db *sqlx.DB) error {
	if err := sqlmigrate.Check(ctx, db.DB, Version); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	return nil
}

// openCheckedPool is openPool for a command that reads or writes the
// schema: it refuses one that does not fit this release.
func openCheckedPool(ctx context.Context, name, dsn string, maxConns int, log *slog.Logger) (*sqlx.DB, error) {
	db, err := openPool(ctx, name, dsn, maxConns, log)
	if err != nil {
		return nil, err
	}
	if err := checkSchema(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// schemaReady makes /readyz false, with the reason, while the schema does
// not fit this release; it checks again once schemaCheckInterval passed, so a
// probe every few seconds costs one query per interval.
func schemaReady(db *sqlx.DB, log *slog.Logger) readyCheck {
	var (
		mu      sync.Mutex
		checked time.Time
		last    error
	)
	return func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if !checked.IsZero() && time.Since(checked) < schemaCheckInterval {
			return last
		}
		err := checkSchema(ctx, db)
		if ctx.Err() != nil {
			return err // the probe gave up: no verdict on the schema
		}
		if err != nil && last == nil {
			log.Error("schema does not fit this release: not ready", "version", Version, "error", err.Error())
		} else if err == nil && last != nil {
			log.Info("schema fits this release again", "version", Version)
		}
		if err != nil {
			err = &notReady{Component: "schema", Err: err}
		}
		checked, last = time.Now(), err
		return err
	}
}

// defaultMigrateOnStart makes dev migrate at start unless told otherwise: on
// a laptop there is no release step to run `promoflow migrate up`.
func defaultMigrateOnStart(s *settings, c *commonConfig) {
	f := s.fs.Lookup("migrate-on-start")
	f.DefValue = "true"
	c.MigrateOnStart = true
}
