package dlqreplay

import (
	"cmp"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// Defaults of Config.
const (
	// GroupPrefix names the replay's consumer group; a filtered replay gets a
	// group per filter, so each filter resumes where it stopped.
	GroupPrefix = "promoflow-dlq-replay"
	// ReplayTopicDefault carries replays; only the catalog consumer reads it.
	ReplayTopicDefault = "pin.catalog.promotion-boost-replay.v1"
	// MaxReplaysDefault is how often one record may be replayed before it is parked.
	MaxReplaysDefault = 3
)

// Config is one replay of the dead-letter topic.
type Config struct {
	// Kafka is the cluster that holds the DLQ and replay topics. Required.
	Kafka kafkakit.Cluster
	// DB is the catalog's database, whose ledger (catalog.dlq_replays)
	// records each original replayed. Required by Run; List does not use it.
	DB *sqlx.DB
	// Force replays dead letters whose original the ledger says an earlier
	// run replayed already.
	Force bool
	// DLQTopic is read. Defaults to middleware.DLQTopicDefault.
	DLQTopic string
	// ReplayTopic is written; only the catalog consumer reads it. Defaults to ReplayTopicDefault.
	ReplayTopic string
	// SourceTopic is the purchase topic, which other consumer groups read too:
	// the replay refuses to write to it. Defaults to event.Topic.
	SourceTopic string
	// Group commits the replay's position, so a stopped replay resumes, and
	// lets one replay at a time run in it. Defaults to GroupPrefix, with a
	// suffix per filter.
	Group string
	// Reason keeps records whose x-dlq-reason contains it.
	Reason string
	// ErrorCode keeps records whose x-dlq-error-code equals it.
	ErrorCode string
	// ID keeps records whose PurchaseId (aggregate_id) or MessageId equals it.
	ID string
	// DryRun lists what would be replayed and parked; it publishes and commits nothing.
	DryRun bool
	// Max stops after that many replayed records; 0 means all.
	Max int64
	// MaxReplays parks a record that was replayed that many times already:
	// it stays in the DLQ, counted as parked. Defaults to 3.
	MaxReplays int
	// Rate caps replayed records per second; 0 means no cap.
	Rate float64
	// Log receives the replay's records. Defaults to slog.Default().
	Log *slog.Logger
}

// Validate reports every bad setting.
func (c Config) Validate() error {
	c.setDefaults() // a copy: what the component will run with
	var errs []error
	if err := c.Kafka.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Max < 0 {
		errs = append(errs, errors.New("max must be >= 0"))
	}
	if c.MaxReplays < 1 {
		errs = append(errs, errors.New("max replays must be >= 1"))
	}
	if c.Rate < 0 {
		errs = append(errs, errors.New("rate must be >= 0"))
	}
	if c.ReplayTopic == c.DLQTopic {
		errs = append(errs, fmt.Errorf("the replay topic must differ from the DLQ topic %s: a replay would read its own output", c.DLQTopic))
	}
	if c.ReplayTopic == c.SourceTopic {
		errs = append(errs, fmt.Errorf("the replay topic must differ from the source topic %s: every consumer group of it would get the replays", c.SourceTopic))
	}
	return errors.Join(errs...)
}

func (c *Config) setDefaults() {
	c.DLQTopic = cmp.Or(c.DLQTopic, middleware.DLQTopicDefault)
	c.ReplayTopic = cmp.Or(c.ReplayTopic, ReplayTopicDefault)
	c.SourceTopic = cmp.Or(c.SourceTopic, event.Topic)
	c.MaxReplays = cmp.Or(c.MaxReplays, MaxReplaysDefault)
	c.Log = cmp.Or(c.Log, slog.Default())
	if c.Group == "" {
		c.Group = GroupPrefix
		if f := c.Reason + "\x00" + c.ErrorCode + "\x00" + c.ID; f != "\x00\x00" {
			sum := sha1.Sum([]byte(f))
			c.Group += "-" + hex.EncodeToString(sum[:4])
		}
	}
}

// verdict is what the replay does with one dead letter.
type verdict int

const (
	skip   verdict = iota // the filter does not match
	park                  // replayed MaxReplays times already
	replay                // forward it
	broken                // by reference, and its record is gone or another one
	done                  // the ledger has its original replayed already
)

func (c Config) decide(msg *message.Message) verdict {
	if c.Reason != "" && !strings.Contains(msg.Metadata.Get(middleware.HeaderDLQReason), c.Reason) {
		return skip
	}
	if c.ErrorCode != "" && msg.Metadata.Get(middleware.HeaderDLQErrorCode) != c.ErrorCode {
		return skip
	}
	if c.ID != "" && msg.Metadata.Get(event.HeaderAggregateID) != c.ID && msg.UUID != c.ID {
		return skip
	}
	if replays(msg) >= c.MaxReplays {
		return park
	}
	return replay
}

// replays is the record's x-dlq-replay-count. A value that is not a count
// parks the record: a replay must never amplify.
func replays(msg *message.Message) int {
	v := msg.Metadata.Get(middleware.HeaderDLQReplayCount)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return int(^uint(0) >> 1)
	}
	return n
}

// pacer waits for the rate limit.
type pacer struct {
	every time.Duration
	mu    sync.Mutex
	next  time.Time
}

func newPacer(rate float64) *pacer {
	if rate <= 0 {
		return &pacer{}
	}
	return &pacer{every: time.Duration(float64(time.Second) / rate)}
}
