package sqlmigrate

import (
	"database/sql"
	"fmt"

	"github.com/lib/pq"
)

// Open opens the PostgreSQL database at dsn as every promoflow process (and
// test) does: lib/pq sends each statement with parameters in one round trip
// (its binary_parameters mode), whatever dsn says.
//
// lib/pq's default sends a statement's parse and its execution as two
// exchanges, each ending in a Sync. Outside a transaction, a pooler in
// transaction mode (PgBouncer) may give the server to another client between
// them: the execution then fails ("bind message supplies 1 parameters, but
// prepared statement "" requires 2"), or runs that client's statement with
// these parameters. In one exchange the pooler cannot split it, and every
// statement saves a round trip. The mode sends []byte parameters in binary:
// a jsonb or uuid value goes as a string.
//
// A URL that lists several hosts with their ports is refused
// (ErrMultiHostURL): lib/pq misreads it.
//
// An unparsable dsn is reported without any part of it (dsnError): it may
// hold a password, and the error reaches logs.
func Open(dsn string) (*sql.DB, error) { return OpenAs(dsn, "") }

// OpenAs is Open whose sessions show application in pg_stat_activity and
// the server's log lines, unless dsn's
// application_name (or fallback_application_name, or $PGAPPNAME) names
// them otherwise. PostgreSQL keeps its first 63 bytes.
func OpenAs(dsn, application string) (*sql.DB, error) {
	if err := checkMultiHostURL(dsn); err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	cfg, err := pq.NewConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", dsnError(dsn))
	}
	if cfg.ApplicationName == "" {
		cfg.ApplicationName = application
	}
	cfg.BinaryParameters = true
	connector, err := pq.NewConnectorConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", dsnError(dsn))
	}
	return sql.OpenDB(connector), nil
}
