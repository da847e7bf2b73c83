package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"

	"github.com/IBM/sarama"
	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // PostgreSQL driver

	"github.com/promoflow/promoflow/router/kafkakit"
)

// commonConfig is what every process needs.
type commonConfig struct {
	DatabaseURL string
	Kafka       kafkaConfig
	HTTPAddr    string
	// AdminAddr is the internal listener's address: /metrics, /admin and the
	// detailed /readyz, for operators and Prometheus only.
	AdminAddr  string
	HTTPLimits httpLimits
	// APIEdge is what the API keeps of a caller's trace headers.
	APIEdge apiPropagation
	// MigrateOnStart is a process's MIGRATE_ON_START (false but in dev); a
	// one-shot command never migrates.
	MigrateOnStart bool
	DBMaxConns     int
	// logSettings are LOG_LEVEL and LOG_FORMAT.
	logSettings

	// DatabaseTLSInsecureOK silences the warning of a DATABASE_URL that does
	// not verify the server (databasetls.go).
	DatabaseTLSInsecureOK bool
	// dev is set by promoflow dev: a laptop, where short demo tokens and an
	// unverified database are fine.
	dev bool

	// DatabaseDirectURL reaches PostgreSQL itself when DatabaseURL goes
	// through a pooler: migrations run there (database.go).
	DatabaseDirectURL string
}

func (c *commonConfig) register(s *settings, httpAddr, adminAddr string) {
	c.registerStores(s)
	s.bool(&c.MigrateOnStart, "migrate-on-start", "MIGRATE_ON_START", false, migrateOnStartUsage)
	s.str(&c.HTTPAddr, "http-addr", "HTTP_ADDR", httpAddr, "listen address of the public listener: the API, /openapi.json, /healthz and a /readyz that names only the component that is not ready")
	s.str(&c.AdminAddr, "admin-addr", "ADMIN_ADDR", adminAddr, "listen address of the internal listener: /metrics, /admin/* and a /readyz with the error's text; keep it off the public network (Prometheus and operators only)")
	c.HTTPLimits.register(s)
	c.APIEdge.register(s)
}

// openCommand parses a one-shot command's args (its settings registered with
// registerStores), and opens its database and its logger on stderr.
func (c *commonConfig) openCommand(ctx context.Context, s *settings, args []string, name string) (*sqlx.DB, *slog.Logger, error) {
	if err := s.parse(args); err != nil {
		return nil, nil, err
	}
	if err := c.validate(); err != nil {
		return nil, nil, err
	}
	log := c.logger(name)
	db, err := openDB(ctx, name, *c, log)
	return db, log, err
}

// registerStores registers what a command that serves no HTTP needs.
func (c *commonConfig) registerStores(s *settings) {
	s.str(&c.DatabaseURL, "database-url", "DATABASE_URL", "", "PostgreSQL URL, e.g. postgres://user@db.example:5432/db?sslmode=verify-full&sslrootcert=/etc/promoflow/ca.crt (required)")
	s.bool(&c.DatabaseTLSInsecureOK, "database-tls-insecure-ok", "DATABASE_TLS_INSECURE_OK", false, databaseTLSInsecureOKUsage)
	c.Kafka.register(s)
	c.logSettings.register(s)
	s.int(&c.DBMaxConns, "db-max-conns", "DB_MAX_CONNS", 20, "most open PostgreSQL connections")
	s.str(&c.DatabaseDirectURL, "database-direct-url", "DATABASE_DIRECT_URL", "", databaseDirectURLUsage)
}

func (c commonConfig) validate() error {
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("database URL is required (--database-url or $DATABASE_URL)"))
	}
	errs = append(errs, c.Kafka.validate())
	errs = append(errs, c.logSettings.validate())
	if c.DBMaxConns < 2 {
		errs = append(errs, errors.New("db max conns must be >= 2"))
	}
	return errors.Join(errs...)
}

// openProcess sets up a long-running process: tracing from OTEL_* variables
// and its database (migrated when asked, and checked to fit this release).
// close undoes both.
func openProcess(ctx context.Context, name string, c commonConfig, log *slog.Logger) (db *sqlx.DB, close func(), err error) {
	stopTracing, err := setupTracing(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	warnDatabaseTLS(c, log)
	db, err = openDB(ctx, name, c, log)
	if err != nil {
		_ = stopTracing(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	return db, func() {
		db.Close()
		_ = stopTracing(context.WithoutCancel(ctx)) // best effort flush at exit
	}, nil
}

// topicConfig is how a process creates the topics it uses.
type topicConfig struct {
	Partitions  int
	Replication int
	Create      bool
}

// topicPartitionsDefault is the partitions of a topic a process creates. The
// consumer keeps one event in flight per partition and commits the events in
// flight together, so partitions bound its batches: on 2 cores one process
// applied about 2.7k events a second with 24 partitions and 3.6k with 48 or
// 96 (docs/benchmarks.md). 48 serves that, and lets up to 48 catalog
// processes share the topic.
const topicPartitionsDefault = 48

func (c *topicConfig) register(s *settings) {
	s.int(&c.Partitions, "topic-partitions", "KAFKA_TOPIC_PARTITIONS", topicPartitionsDefault, "partitions of a topic this process creates")
	s.int(&c.Replication, "topic-replication", "KAFKA_TOPIC_REPLICATION", 0,
		"replication factor of a topic this process creates; 0 follows the cluster's brokers at start: 1 on one, 3 on three or more (min.insync.replicas 2 with 3 replicas)")
	s.bool(&c.Create, "create-topics", "KAFKA_CREATE_TOPICS", true, "create the topics it uses at start when missing")
}

func (c topicConfig) validate() error {
	var errs []error
	if c.Partitions < 1 {
		errs = append(errs, errors.New("topic partitions must be >= 1"))
	}
	if c.Replication < 0 || c.Replication > math.MaxInt16 {
		errs = append(errs, errors.New("topic replication must be >= 1, or 0 to follow the cluster"))
	}
	return errors.Join(errs...)
}

// ensure creates the missing topics when asked to: the purchase topic as a
// compacted changelog (every event is a full snapshot keyed by PurchaseId, so
// a rebuild from the earliest offset is complete at any age), the others with
// the broker's default retention. It warns when an existing purchase topic is
// not compacted: a rebuild refuses once retention removed some of it.
func (c topicConfig) ensure(cluster kafkakit.Cluster, log *slog.Logger, purchaseTopic string, others ...string) error {
	if c.Create {
		specs := []kafkakit.Topic{{Name: purchaseTopic, Partitions: int32(c.Partitions), Replication: int16(c.Replication),
			CleanupPolicy: kafkakit.PolicyCompact}}
		for _, t := range others {
			specs = append(specs, kafkakit.Topic{Name: t, Partitions: int32(c.Partitions), Replication: int16(c.Replication)})
		}
		created, err := kafkakit.EnsureTopics(cluster, specs...)
		for _, t := range created {
			log.Info("topic created", "topic", t.Name, "partitions", t.Partitions, "replication", t.Replication,
				"minInsyncReplicas", cmp.Or(kafkakit.MinInsyncReplicasFor(t.Replication), "broker default"))
		}
		if err != nil {
			return err
		}
	}
	admin, err := sarama.NewClusterAdmin(cluster.Brokers, cluster.ClientConfig("promoflow-admin"))
	if err != nil {
		return fmt.Errorf("connect kafka admin: %w", err)
	}
	defer admin.Close()
	policies, err := kafkakit.CleanupPolicies(admin, purchaseTopic)
	if err != nil {
		log.Warn("cannot read the purchase topic's cleanup policy", "topic", purchaseTopic, "error", err.Error())
		return nil
	}
	if !kafkakit.OnlyCompacted(policies) {
		log.Warn("purchase topic is not compacted", "topic", purchaseTopic, "cleanupPolicy", strings.Join(policies, ","),
			"consequence", "the promotion relay publishes nothing to it, and a projection rebuild refuses once retention removed records; set cleanup.policy=compact")
	}
	return nil
}
