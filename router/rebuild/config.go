package rebuild

import (
	"cmp"
	"errors"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// Defaults of Config.
const (
	// StatusEveryDefault is how often a running rebuild writes its progress.
	StatusEveryDefault = time.Second
	// StaleAfterDefault is how long a running rebuild may go without writing
	// its progress before readers call it abandoned (its process died).
	StaleAfterDefault = 30 * time.Second
	// SwitchRecordsDefault is the most records past the last catch-up's ends
	// that the switch reads and folds in while it holds the writers back.
	SwitchRecordsDefault = 1000
	// CatchUpsDefault is the most catch-ups before the switch.
	CatchUpsDefault = 10
	// LoadSliceDefault is the most records of the topic one transaction of
	// the load builds the new replica from.
	LoadSliceDefault = 5_000
	// SwitchWaitDefault is how long the switch waits for a lock before it
	// gives way to the projection's writers and tries again.
	SwitchWaitDefault = 2 * time.Second
	// SwitchMaxRecordsDefault is the most records past the last catch-up
	// that the switch folds in under its locks; more and it gives way.
	SwitchMaxRecordsDefault = 10_000
	// SwitchStatementTimeoutDefault bounds each statement of the switch.
	SwitchStatementTimeoutDefault = 5 * time.Second
	// SwitchIdleTimeoutDefault bounds each pause of the switch between two
	// statements: past it PostgreSQL ends the switch's session, and its
	// locks with it.
	SwitchIdleTimeoutDefault = 3 * time.Second
)

// Config configures a Rebuilder.
type Config struct {
	// DB is the catalog database. Required.
	DB *sqlx.DB
	// Kafka is the cluster that holds Topic. Required.
	Kafka kafkakit.Cluster
	// Topic is the purchase-changed changelog to rebuild from. Defaults to event.Topic.
	Topic string
	// Log receives the rebuild's records. Defaults to slog.Default().
	Log *slog.Logger
	// StatusEvery is how often the progress is written. Defaults to 1s.
	StatusEvery time.Duration
	// StaleAfter marks a running rebuild abandoned when its progress is older. Defaults to 30s.
	StaleAfter time.Duration
	// LoadSlice is the most records of the topic one transaction of the load
	// builds the new replica from: the staged events are split into as many
	// slices by purchase. Defaults to 5,000 (about 0.1 s a slice on a quiet
	// server; a slice of 10,000 held its xid 2.2-2.85 s on a loaded one).
	LoadSlice int
	// SwitchRecords: catch-ups go on until at most this many records arrived
	// past the last one's ends; the switch reads and folds those under its
	// locks. Defaults to 1000.
	SwitchRecords int
	// CatchUps caps the catch-ups in a row before the switch tries. Defaults
	// to 10.
	CatchUps int
	// SwitchMaxRecords is the most records past the last catch-up that the
	// switch reads and folds in while it holds the projection's writers
	// back: with more pending (a backlog, the catch-ups used up under heavy
	// traffic) it gives way, catches up and tries again. Defaults to 10,000.
	SwitchMaxRecords int
	// SwitchStatementTimeout bounds each statement of the switch
	// (statement_timeout): past it the switch gives way. Defaults to 5s.
	SwitchStatementTimeout time.Duration
	// SwitchIdleTimeout bounds each pause of the switch's transaction between
	// two statements (idle_in_transaction_session_timeout): the switch reads
	// Kafka between them, and a rebuild cut off from PostgreSQL (a network
	// partition) would otherwise leave its transaction, and the locks that
	// hold the consumer back, on the server until TCP keepalive notices (two
	// hours by default). Past it PostgreSQL ends the session; a switch that
	// was only slow gives way. Defaults to 3s.
	SwitchIdleTimeout time.Duration
	// SwitchWait bounds how long the switch waits for each lock it takes
	// (lock_timeout). The switch holds the projection's writers back while
	// it waits, so a reader that holds the replica for long (an audit, a
	// report) would stall the consumer for as long; past SwitchWait the
	// switch rolls back, lets the writers go on for SwitchWait, catches up
	// and tries again. Defaults to 2s.
	SwitchWait time.Duration
	// Cooldown refuses a rebuild (a *CooldownError) that would start within
	// this long after the last one started, in any process. Zero: none.
	Cooldown time.Duration
}

// Validate reports every missing or out-of-range setting.
func (c Config) Validate() error {
	c.setDefaults() // a copy: what the component will run with
	var errs []error
	if c.DB == nil {
		errs = append(errs, errors.New("rebuild: database is required"))
	}
	if len(c.Kafka.Brokers) == 0 {
		errs = append(errs, errors.New("rebuild: kafka brokers are required"))
	}
	if c.StatusEvery <= 0 || c.StaleAfter <= c.StatusEvery {
		errs = append(errs, errors.New("rebuild: status interval must be positive and below the stale limit"))
	}
	if c.SwitchRecords < 1 || c.CatchUps < 1 || c.LoadSlice < 1 {
		errs = append(errs, errors.New("rebuild: switch records, catch-ups and load slice must be >= 1"))
	}
	if c.SwitchWait < time.Millisecond || c.SwitchStatementTimeout < time.Millisecond || c.SwitchIdleTimeout < time.Millisecond {
		errs = append(errs, errors.New("rebuild: switch wait, statement timeout and idle timeout must be at least 1ms"))
	}
	if c.Cooldown < 0 {
		errs = append(errs, errors.New("rebuild: cooldown must be >= 0"))
	}
	if c.SwitchMaxRecords < c.SwitchRecords {
		errs = append(errs, errors.New("rebuild: switch max records must be >= switch records"))
	}
	return errors.Join(errs...)
}

func (c *Config) setDefaults() {
	c.Topic = cmp.Or(c.Topic, event.Topic)
	c.Log = cmp.Or(c.Log, slog.Default())
	c.StatusEvery = cmp.Or(c.StatusEvery, StatusEveryDefault)
	c.StaleAfter = cmp.Or(c.StaleAfter, StaleAfterDefault)
	c.SwitchRecords = cmp.Or(c.SwitchRecords, SwitchRecordsDefault)
	c.CatchUps = cmp.Or(c.CatchUps, CatchUpsDefault)
	c.LoadSlice = cmp.Or(c.LoadSlice, LoadSliceDefault)
	c.SwitchWait = cmp.Or(c.SwitchWait, SwitchWaitDefault)
	c.SwitchMaxRecords = cmp.Or(c.SwitchMaxRecords, SwitchMaxRecordsDefault)
	c.SwitchStatementTimeout = cmp.Or(c.SwitchStatementTimeout, SwitchStatementTimeoutDefault)
	c.SwitchIdleTimeout = cmp.Or(c.SwitchIdleTimeout, SwitchIdleTimeoutDefault)
}
