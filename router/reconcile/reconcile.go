// Package reconcile repairs the purchase topic after a failover of the
// promotion database.
//
// The guarantee: once a run has ended and the relay has published what it
// wrote, every purchase's newest event on the topic is its row's state in
// the database. An asynchronous failover breaks that: the relay may have
// published changes the promoted standby never received (phantoms), so the
// catalog boosts purchases that do not exist, or no longer in that state.
//
// The mechanism: a run reads the topic from its earliest offset to the end
// it sees at start (read_committed), keeps each purchase's newest version,
// and compares with promotion.promotion_purchases. Each purchase the
// database lacks, or holds at a lower version, gets the database's truth
// through the outbox at the topic's version + 1 (purchase.Service.Reconcile):
// the catalog applies versions at or above the one it stores, so it takes
// the repair over the phantom. A purchase the database lacks becomes a
// Cancelled row, which ends its boost. A second run finds nothing: the row
// now holds a version above the topic's until the relay publishes it, and
// the topic's then.
//
// TestReconcile_RepairsPhantomsAfterFailover proves it across a failover.
package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/handlers/purchase"
	"github.com/promoflow/promoflow/router/bounded"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// Config configures a run.
type Config struct {
	// DB is the promotion database. Required.
	DB *sqlx.DB
	// Kafka is the cluster of the purchase topic. Required.
	Kafka kafkakit.Cluster
	// Topic is the purchase topic. Defaults to event.Topic.
	Topic string
	// DryRun finds the phantoms and writes nothing.
	DryRun bool
	// Log is told of each repair. Defaults to slog.Default().
	Log *slog.Logger
}

// Report is what a run found and did.
type Report struct {
	// Records read, of which Unreadable break the contract (left out), and
	// the distinct purchases they name.
	Records    int64 `json:"records"`
	Unreadable int64 `json:"unreadable"`
	Purchases  int   `json:"purchases"`
	// Missing are on the topic and not in the database; Behind are in the
	// database at a lower version than the topic. Both are sorted.
	Missing []uuid.UUID `json:"missing"`
	Behind  []uuid.UUID `json:"behind"`
	// Repaired were written through the outbox (none on a dry run).
	Repaired int `json:"repaired"`
}

// Found is the number of phantoms the run found.
func (r Report) Found() int { return len(r.Missing) + len(r.Behind) }

// ErrReadOnly is a run that would repair on a standby, which refuses writes.
var ErrReadOnly = errors.New("the database is a standby in recovery (read-only): run reconcile against the primary, or with --dry-run")

// versionChunk is how many purchases one read of the database compares.
const versionChunk = 1000

// Validate reports every missing setting.
func (c Config) Validate() error {
	var errs []error
	if c.DB == nil {
		errs = append(errs, errors.New("reconcile needs the promotion database"))
	}
	if err := c.Kafka.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Run reads the topic, compares it with the database and, unless
// cfg.DryRun, repairs each phantom. The newest event of every purchase is
// held in memory: about 1 KB a purchase.
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg.Topic = cmp.Or(cfg.Topic, event.Topic)
	cfg.Log = cmp.Or(cfg.Log, slog.Default())
	var rep Report
	if err := cfg.Validate(); err != nil {
		return rep, err
	}
	if !cfg.DryRun {
		var standby bool
		if err := cfg.DB.GetContext(ctx, &standby, `SELECT pg_is_in_recovery()`); err != nil {
			return rep, fmt.Errorf("check the database is writable: %w", err)
		}
		if standby {
			return rep, ErrReadOnly
		}
	}
	newest, err := readNewest(ctx, cfg, &rep)
	if err != nil {
		return rep, err
	}
	rep.Purchases = len(newest)
	ids := make([]uuid.UUID, 0, len(newest))
	for id := range newest {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	for chunk := range slices.Chunk(ids, versionChunk) {
		stored, err := purchase.Versions(ctx, cfg.DB, chunk)
		if err != nil {
			return rep, err
		}
		for _, id := range chunk {
			v, ok := stored[id]
			switch {
			case !ok:
				rep.Missing = append(rep.Missing, id)
			case v < newest[id].Version:
				rep.Behind = append(rep.Behind, id)
			}
		}
	}
	if cfg.DryRun {
		return rep, nil
	}
	svc, err := purchase.NewService(cfg.DB, purchase.ServiceConfig{Topic: cfg.Topic})
	if err != nil {
		return rep, err
	}
	runID := "reconcile-" + uuid.NewString()
	for _, id := range slices.Concat(rep.Missing, rep.Behind) {
		r, err := svc.Reconcile(ctx, newest[id], runID)
		if err != nil {
			return rep, fmt.Errorf("reconcile purchase %s: %w", id, err)
		}
		if r.Kind == "" {
			continue // changed since the comparison: the database is ahead now
		}
		rep.Repaired++
		args := []any{"PurchaseId", id, "kind", r.Kind, "topicVersion", r.TopicVersion, "Version", r.Purchase.Version,
			"Status", r.Purchase.Status, "runId", runID}
		if r.Kind == purchase.PhantomMissing {
			args = append(args, "reason", purchase.MissingReason)
		}
		cfg.Log.Warn("phantom purchase repaired through the outbox", args...)
	}
	return rep, nil
}

// readNewest reads every partition from its earliest offset to its end at
// start and keeps each purchase's event of the highest version.
func readNewest(ctx context.Context, cfg Config, rep *Report) (map[uuid.UUID]event.PurchaseChanged, error) {
	client, err := bounded.Dial(cfg.Kafka, "promoflow-reconcile")
	if err != nil {
		return nil, err
	}
	defer client.Close()
	parts, err := client.Partitions(cfg.Topic)
	if err != nil {
		return nil, err
	}
	ranges := make([]bounded.Range, len(parts))
	for i, p := range parts {
		ranges[i] = p.Whole()
	}
	var (
		mu         sync.Mutex
		newest     = map[uuid.UUID]event.PurchaseChanged{}
		records    atomic.Int64
		unreadable atomic.Int64
	)
	err = client.Read(ctx, ranges, func(_ context.Context, rec *sarama.ConsumerMessage) error {
		records.Add(1)
		ev, err := event.Parse(rec.Value)
		if err != nil {
			unreadable.Add(1)
			cfg.Log.Warn("reconcile skipped an unreadable record", "topic", rec.Topic, "partition", rec.Partition,
				"offset", rec.Offset, "error", err.Error())
			return nil
		}
		mu.Lock()
		// At equal versions the later record wins: a partition is read in
		// offset order, and the relay of the new primary may have published
		// its own transition at a version a phantom took.
		if cur, ok := newest[ev.PurchaseId]; !ok || ev.Version >= cur.Version {
			newest[ev.PurchaseId] = ev
		}
		mu.Unlock()
		return nil
	}, nil)
	rep.Records, rep.Unreadable = records.Load(), unreadable.Load()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", cfg.Topic, err)
	}
	return newest, nil
}
