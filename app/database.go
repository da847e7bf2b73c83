package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/promoflow/promoflow/sqlmigrate"
)

// How a process reaches PostgreSQL: the URL (TLS, a pooler) and where
// migrations run. docs/runbooks/postgres-connections.md says what each
// production setup needs.

const databaseDirectURLUsage = "PostgreSQL URL that bypasses a pooler (PgBouncer): migrations run there when set; empty: on the database URL"

// registerPreparedStatements binds DATABASE_PREPARED_STATEMENTS onto a
// consumer config's DisablePreparedStatements.
func registerPreparedStatements(s *settings, disable *bool) {
	s.notBool(disable, "database-prepared-statements", "DATABASE_PREPARED_STATEMENTS", true,
		"prepare the consumer's apply statements once per connection; false behind a pooler in transaction mode (PgBouncer before 1.21)")
}

// databaseWaitDefault is how long a process waits for PostgreSQL to accept
// connections at start (a server or a pooler still starting).
const databaseWaitDefault = 30 * time.Second

// openDB opens the database URL, waiting for PostgreSQL, applies the
// missing migrations when asked (on the direct URL when set), and refuses a
// schema that does not fit this release (checkSchema).
func openDB(ctx context.Context, name string, c commonConfig, log *slog.Logger) (*sqlx.DB, error) {
	db, err := openPool(ctx, name, c.DatabaseURL, c.DBMaxConns, log)
	if err != nil {
		return nil, err
	}
	if c.MigrateOnStart {
		if err := migrateOnStart(ctx, name, c, db, log); err != nil {
			db.Close()
			return nil, err
		}
	}
	if err := checkSchema(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// migrateOnStart applies the missing migrations on the direct URL when set (a
// pooler's timeouts and limits stay out of schema changes), else on db. The
// runner holds no session state, so db may go through a pooler too.
func migrateOnStart(ctx context.Context, name string, c commonConfig, db *sqlx.DB, log *slog.Logger) error {
	target := db
	if c.DatabaseDirectURL != "" {
		direct, err := openPool(ctx, name, c.DatabaseDirectURL, 2, log)
		if err != nil {
			return fmt.Errorf("direct database URL: %w", err)
		}
		defer direct.Close()
		target = direct
	}
	applied, err := sqlmigrate.Up(ctx, target.DB)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	log.Info("migrations applied", "versions", applied, "direct", c.DatabaseDirectURL != "")
	return nil
}

// openPool opens dsn with at most maxConns connections, its sessions named
// for the command (applicationName), and waits up to databaseWaitDefault for
// it to answer. A failure that waiting cannot fix ends the wait at once,
// naming its cause (connectError).
func openPool(ctx context.Context, name, dsn string, maxConns int, log *slog.Logger) (*sqlx.DB, error) {
	raw, err := sqlmigrate.OpenAs(dsn, applicationName(name))
	if err != nil {
		return nil, err
	}
	db := sqlx.NewDb(raw, "postgres")
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)

	deadline := time.Now().Add(databaseWaitDefault)
	for {
		pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = db.PingContext(pingCtx)
		cancel()
		if err == nil {
			return db, nil
		}
		if cause := permanentCause(err); cause != "" {
			db.Close()
			return nil, &connectError{cause: cause, err: err}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			db.Close()
			return nil, fmt.Errorf("connect to database: %w", err)
		}
		log.Warn("database not ready, retrying", "error", err.Error())
		time.Sleep(time.Second)
	}
}

// connectError is a connection failure that waiting cannot fix.
type connectError struct {
	cause string // what to fix, in words
	err   error
}

func (e *connectError) Error() string {
	return "connect to database: " + e.cause + ": " + e.err.Error()
}
func (e *connectError) Unwrap() error { return e.err }

// permanentCause names what is wrong when err is a connection failure that
// waiting cannot fix, and is empty for one that may pass (a server starting,
// a refused or broken connection, too many connections).
func permanentCause(err error) string {
	var (
		hostname  x509.HostnameError
		authority x509.UnknownAuthorityError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		path      *fs.PathError
		pqErr     *pq.Error
	)
	switch {
	case errors.As(err, &hostname):
		return "the server's certificate is not valid for the host in the database URL (sslmode=verify-full)"
	case errors.As(err, &authority), errors.As(err, &invalid), errors.As(err, &verify):
		return "the server's certificate is not trusted (check sslrootcert)"
	case errors.Is(err, pq.ErrSSLNotSupported):
		return "the server does not speak TLS, which sslmode asks for"
	case errors.Is(err, pq.ErrSSLKeyHasWorldPermissions), errors.Is(err, pq.ErrSSLKeyUnknownOwnership):
		return "the client key (sslkey) may be read by others; make it mode 0600"
	case errors.As(err, &path):
		return "a file the database URL names cannot be read"
	case errors.As(err, &pqErr) && pqErr.Code.Class() == "28":
		return "the server refused the login"
	case errors.As(err, &pqErr) && pqErr.Code == "3D000":
		return "the database does not exist"
	}
	return ""
}

// applicationName is the application_name of a command's sessions, unless
// the database URL gives its own: "promoflow-promotion", "promoflow-rebuild".
// It tells an operator on a shared server, and `promoflow status`, whose
// session holds the relay's position or the oldest transaction.
func applicationName(command string) string { return "promoflow-" + command }
