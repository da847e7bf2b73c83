package audit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/router/bounded"
)

// staging is the tables of one replica check: unlogged, in the catalog
// schema, named after the check's start and an id of its own, and dropped
// when it ends. Each is written in chunks of short transactions and read by
// statements that write nothing, so that the check never holds an xid for
// long: every promotion relay of the server waits for the oldest one.
type staging struct {
	prefix string
	// events holds the records up to the ends read; since those past them,
	// read after the replica.
	events, since boost.EventTable
}

// stagingPattern matches the tables of every replica check; its group is the
// check's start in Unix seconds.
const stagingPattern = `^audit_([0-9]+)_[0-9a-f]{16}_`

// abandonedAfter is the age past which a check's tables were left by a
// process that died: a later check drops them.
const abandonedAfter = 24 * time.Hour

func newStaging() staging {
	prefix := fmt.Sprintf("audit_%d_%s_", time.Now().Unix(), strings.ReplaceAll(uuid.NewString(), "-", "")[:16])
	return staging{prefix: prefix, events: boost.StagingTable(prefix + "events"), since: boost.StagingTable(prefix + "since")}
}

// outcome is the table of the purchases whose replica is not the newest
// event's: drift, pending, or ahead of the records read.
func (s staging) outcome() string { return `catalog.` + pq.QuoteIdentifier(s.prefix+"outcome") }

// create creates the tables, empty, in one statement (one transaction).
func (s staging) create(ctx context.Context, db *sqlx.DB) error {
	if _, err := db.ExecContext(ctx, s.events.CreateSQL()+`; `+s.since.CreateSQL()+`;
		CREATE UNLOGGED TABLE `+s.outcome()+` (purchase_id uuid NOT NULL, on_topic boolean NOT NULL,
			replica_version bigint, version bigint, status text, boost_weight integer, target_kinds text[],
			target_ids uuid[], state text NOT NULL)`); err != nil {
		return fmt.Errorf("create replica check tables: %w", err)
	}
	return nil
}

// drop drops the tables; and those of checks whose process died, once a
// day old.
func (s staging) drop(ctx context.Context, db *sqlx.DB) error {
	var tables []string
	if err := db.SelectContext(ctx, &tables, `SELECT 'catalog.' || quote_ident(relname) FROM pg_class
		WHERE relnamespace = 'catalog'::regnamespace AND relkind IN ('r', 'p') AND relname ~ $1
			AND (starts_with(relname, $2) OR substring(relname FROM $1)::bigint < extract(epoch FROM now()) - $3)
		ORDER BY relkind, relname`, stagingPattern, s.prefix, abandonedAfter.Seconds()); err != nil {
		return fmt.Errorf("list replica check tables: %w", err)
	}
	for _, t := range tables {
		if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS `+t); err != nil {
			return fmt.Errorf("drop replica check table %s: %w", t, err)
		}
	}
	return nil
}

// stage copies the records of ranges into t, a chunk per transaction, and
// returns how many rows it committed.
func (a *Auditor) stage(ctx context.Context, client *bounded.Client, t boost.EventTable, ranges []bounded.Range,
	unreadable *atomic.Int64, refused func(boost.Refused)) (int64, error) {
	loader, err := t.NewLoader(ctx, boost.LoaderConfig{DB: a.cfg.DB, Check: a.check, Refused: refused,
		Skipped: func(int32, int64, error) { unreadable.Add(1) }})
	if err != nil {
		return 0, err
	}
	err = client.Read(ctx, ranges, func(_ context.Context, rec *sarama.ConsumerMessage) error {
		return loader.Add(rec.Partition, rec.Offset, rec.Key, rec.Value)
	}, nil)
	if err := errors.Join(err, loader.Close()); err != nil {
		return 0, fmt.Errorf("read %s: %w", a.cfg.Topic, err)
	}
	return loader.Rows(), nil
}
