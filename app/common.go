package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // PostgreSQL driver

	"github.com/promoflow/promoflow/sqlmigrate"
)

// commonConfig is what every process needs.
type commonConfig struct {
	DatabaseURL    string
	KafkaBrokers   string
	HTTPAddr       string
	LogLevel       string
	MigrateOnStart bool
	DBMaxConns     int
}

func (c *commonConfig) register(s *settings, httpAddr string) {
	s.str(&c.DatabaseURL, "database-url", "DATABASE_URL", "", "PostgreSQL URL, e.g. postgres://user@127.0.0.1:5432/db?sslmode=disable (required)")
	s.str(&c.KafkaBrokers, "kafka-brokers", "KAFKA_BROKERS", "", "comma-separated Kafka bootstrap servers (required)")
	s.str(&c.HTTPAddr, "http-addr", "HTTP_ADDR", httpAddr, "listen address of the API, /healthz, /readyz and /metrics")
	s.str(&c.LogLevel, "log-level", "LOG_LEVEL", "info", "debug, info, warn or error")
	s.bool(&c.MigrateOnStart, "migrate-on-start", "MIGRATE_ON_START", true, "apply missing migrations at start (safe with several processes)")
	s.int(&c.DBMaxConns, "db-max-conns", "DB_MAX_CONNS", 20, "most open PostgreSQL connections")
}

func (c commonConfig) validate() error {
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("database URL is required (--database-url or $DATABASE_URL)"))
	}
	if len(splitList(c.KafkaBrokers)) == 0 {
		errs = append(errs, errors.New("kafka brokers are required (--kafka-brokers or $KAFKA_BROKERS)"))
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if c.DBMaxConns < 2 {
		errs = append(errs, errors.New("db max conns must be >= 2"))
	}
	return errors.Join(errs...)
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("log level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

func newLogger(level, service string) *slog.Logger {
	l, _ := parseLevel(level)
	return slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: l})).With("service", service)
}

// openDB connects, waiting up to 30s for PostgreSQL to accept connections,
// and applies migrations when asked.
func openDB(ctx context.Context, c commonConfig, log *slog.Logger) (*sqlx.DB, error) {
	db, err := sqlx.Open("postgres", c.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	db.SetMaxOpenConns(c.DBMaxConns)
	db.SetMaxIdleConns(c.DBMaxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)

	deadline := time.Now().Add(30 * time.Second)
	for {
		pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = db.PingContext(pingCtx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			db.Close()
			return nil, fmt.Errorf("connect to database: %w", err)
		}
		log.Warn("database not ready, retrying", "error", err.Error())
		time.Sleep(time.Second)
	}
	if c.MigrateOnStart {
		applied, err := sqlmigrate.Up(ctx, db.DB)
		if err != nil {
			db.Close()
			return nil, fmt.Errorf("migrate: %w", err)
		}
		log.Info("migrations applied", "versions", applied)
	}
	return db, nil
}
