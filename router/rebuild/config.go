package rebuild

import (
	"cmp"
	"errors"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
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
)

// Config configures a Rebuilder.
type Config struct {
	// DB is the catalog database. Required.
	DB *sqlx.DB
	// Kafka is the cluster that holds Topic. Required.
	Kafka kafkakit.Cluster
	// Topic is the purchase-changed changelog to replay. Defaults to event.Topic.
	Topic string
	// Chain applies one record: the catalog consumer's chain without its
	// poison queue (router.CatalogChain). Required.
	Chain message.HandlerFunc
	// Log receives the rebuild's records. Defaults to slog.Default().
	Log *slog.Logger
	// StatusEvery is how often the progress is written. Defaults to 1s.
	StatusEvery time.Duration
	// StaleAfter marks a running rebuild abandoned when its progress is older. Defaults to 30s.
	StaleAfter time.Duration
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
	if c.Chain == nil {
		errs = append(errs, errors.New("rebuild: consumer chain is required"))
	}
	if c.StatusEvery <= 0 || c.StaleAfter <= c.StatusEvery {
		errs = append(errs, errors.New("rebuild: status interval must be positive and below the stale limit"))
	}
	return errors.Join(errs...)
}

func (c *Config) setDefaults() {
	c.Topic = cmp.Or(c.Topic, event.Topic)
	c.Log = cmp.Or(c.Log, slog.Default())
	c.StatusEvery = cmp.Or(c.StatusEvery, StatusEveryDefault)
	c.StaleAfter = cmp.Or(c.StaleAfter, StaleAfterDefault)
}
