package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"sort"

	"github.com/promoflow/promoflow/sqlmigrate"
)

func runMigrate(ctx context.Context, args []string) error {
	action := "up"
	if len(args) > 0 && (args[0] == "up" || args[0] == "status") {
		action, args = args[0], args[1:]
	}
	var dbURL, directURL string
	var logs logSettings
	s := newSettings("migrate", "Applies (up) or lists (status) the embedded migrations. Safe while other processes migrate.")
	s.str(&dbURL, "database-url", "DATABASE_URL", "", "PostgreSQL URL (required)")
	s.str(&directURL, "database-direct-url", "DATABASE_DIRECT_URL", "", databaseDirectURLUsage)
	logs.register(s)
	if err := s.parse(args); err != nil {
		return err
	}
	if err := logs.validate(); err != nil {
		return err
	}
	if dbURL == "" {
		return errors.New("database URL is required (--database-url or $DATABASE_URL)")
	}
	log := logs.logger("migrate")
	db, err := openPool(ctx, "migrate", cmp.Or(directURL, dbURL), 2, log)
	if err != nil {
		return err
	}
	defer db.Close()
	if action == "status" {
		st, err := sqlmigrate.Status(ctx, db.DB)
		if err != nil {
			return err
		}
		versions := make([]string, 0, len(st))
		for v := range st {
			versions = append(versions, v)
		}
		sort.Strings(versions)
		for _, v := range versions {
			state := "pending"
			if st[v] {
				state = "applied"
			}
			fmt.Fprintf(os.Stdout, "%-40s %s\n", v, state)
		}
		return nil
	}
	applied, err := sqlmigrate.Up(ctx, db.DB)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "applied %d migration(s): %v\n", len(applied), applied)
	return nil
}
