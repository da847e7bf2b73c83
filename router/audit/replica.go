package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/bounded"
)

// ReplicaReport is the replica's check against the purchase topic.
type ReplicaReport struct {
	// Purchases seen on the topic, of which Pending have a record the catalog
	// consumer has not consumed yet and a replica behind it (not compared),
	// and Drifted differ.
	Purchases int64 `json:"purchases"`
	Pending   int64 `json:"pending"`
	Drifted   int   `json:"drifted"`
	// Unreadable records break the contract (they went to the DLQ).
	Unreadable int64 `json:"unreadable"`
	// Refused records have a row PostgreSQL refused to store (the consumer
	// dead-lettered them as sql_rejected): left out of the comparison.
	// RefusedRecords names the first ones (Config.Samples).
	Refused        int64           `json:"refused"`
	RefusedRecords []boost.Refused `json:"refusedRecords,omitempty"`
	Samples        []PurchaseDrift `json:"samples,omitempty"`
}

// PurchaseDrift is a purchase whose contributions differ from its latest event.
type PurchaseDrift struct {
	PurchaseId uuid.UUID `json:"purchaseId"`
	Problem    string    `json:"problem"`
}

// latest is what the replica must hold for one purchase.
type latest struct {
	version int64
	active  bool
	weight  int
	targets []event.Target // Project and PropertyObject only, sorted
}

type contribution struct {
	PurchaseID uuid.UUID `db:"purchase_id"`
	Kind       string    `db:"target_kind"`
	TargetID   uuid.UUID `db:"target_id"`
	Version    int64     `db:"version"`
	Active     bool      `db:"active"`
	Weight     int       `db:"boost_weight"`
}

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

// Replica reads the whole purchase topic up to its end now into a staging
// table of PostgreSQL (COPY, a chunk per short transaction), and compares
// each purchase's newest event with the replica's contributions in one SQL
// statement that writes nothing: its memory does not grow with the topic,
// and no transaction of it holds an xid for longer than a chunk. A purchase whose replica differs is pending, not drift, when the
// catalog consumer has not consumed one of its records yet and the replica
// is behind the topic; a replica at the topic's newest version is compared,
// whatever the group's offsets say (a rebuild builds the replica from the
// topic without moving them).
//
// The replica is read after the topic, so the live consumer can have applied
// records past the end the check read: a purchase whose replica holds a
// newer version than the records read (or that the records read do not name)
// is pending when the topic's records since that end hold that version, and
// drift when no record on the topic does.
func (a *Auditor) Replica(ctx context.Context) (ReplicaReport, error) {
	var r ReplicaReport
	if len(a.cfg.Kafka.Brokers) == 0 || a.cfg.ConsumerGroup == "" {
		return r, errors.New("audit: the replica check needs kafka brokers and the consumer group")
	}
	client, err := bounded.Dial(a.cfg.Kafka, "promoflow-audit")
	if err != nil {
		return r, err
	}
	defer client.Close()
	ranges, committed, err := a.plan(ctx, client)
	if err != nil {
		return r, err
	}
	st := newStaging()
	defer func() {
		if err := st.drop(context.WithoutCancel(ctx), a.cfg.DB); err != nil {
			a.cfg.Log.Warn("replica check tables not dropped; the next check drops them a day on", "error", err.Error())
		}
	}()
	if err := st.create(ctx, a.cfg.DB); err != nil {
		return r, err
	}
	var unreadable atomic.Int64
	refused := func(rf boost.Refused) {
		a.cfg.Log.Warn("audit skipped a record PostgreSQL refused", "topic", a.cfg.Topic, "partition", rf.Partition,
			"offset", rf.Offset, "code", rf.Code, "reason", rf.Reason)
		r.Refused++ // one loader calls it at a time, before the report is read
		if len(r.RefusedRecords) < a.cfg.Samples {
			r.RefusedRecords = append(r.RefusedRecords, rf)
		}
	}
	copied, err := a.stage(ctx, client, st.events, ranges, &unreadable, refused)
	if err != nil {
		return r, err
	}
	ahead, err := a.classify(ctx, st, committed)
	if err != nil {
		return r, err
	}
	// Checked after the comparison: a table emptied before or during it is
	// still empty now.
	if err := st.events.CheckRows(ctx, a.cfg.DB, copied); err != nil {
		return r, fmt.Errorf("replica check: %w; run it again", err)
	}
	if ahead > 0 {
		if err := a.settleAhead(ctx, client, st, ranges); err != nil {
			return r, err
		}
	}
	if err := a.cfg.DB.GetContext(ctx, &r, `SELECT (SELECT count(DISTINCT purchase_id) FROM `+st.events.String()+`)
			+ count(*) FILTER (WHERE NOT on_topic AND state = 'pending') AS purchases,
		count(*) FILTER (WHERE state = 'pending') AS pending, count(*) FILTER (WHERE state = 'drift') AS drifted
		FROM `+st.outcome()); err != nil {
		return r, fmt.Errorf("count replica check: %w", err)
	}
	r.Unreadable = unreadable.Load()
	if r.Samples, err = a.samples(ctx, st); err != nil {
		return r, err
	}
	return r, nil
}

// plan reads the partitions' ends now and the group's committed offsets,
// and returns the ranges up to the ends and the offsets by partition (none:
// absent).
func (a *Auditor) plan(ctx context.Context, client *bounded.Client) ([]bounded.Range, map[int32]int64, error) {
	parts, err := client.Partitions(a.cfg.Topic)
	if err != nil {
		return nil, nil, err
	}
	if a.afterEnds != nil {
		if err := a.afterEnds(ctx); err != nil {
			return nil, nil, err
		}
	}
	admin, err := client.Admin()
	if err != nil {
		return nil, nil, err
	}
	ids := make([]int32, len(parts))
	ranges := make([]bounded.Range, len(parts))
	for i, p := range parts {
		ids[i], ranges[i] = p.Partition, p.Whole()
	}
	res, err := admin.ListConsumerGroupOffsets(a.cfg.ConsumerGroup, map[string][]int32{a.cfg.Topic: ids})
	if err != nil {
		return nil, nil, fmt.Errorf("offsets of group %s: %w", a.cfg.ConsumerGroup, err)
	}
	committed := map[int32]int64{}
	for _, p := range ids {
		if b := res.GetBlock(a.cfg.Topic, p); b != nil && b.Offset >= 0 {
			committed[p] = b.Offset
		}
	}
	return ranges, committed, nil
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

// classifySQL sorts every purchase of the topic read or of the replica: ok
// (the replica holds the newest event's contributions), drift, pending (a
// record not consumed yet, and a replica behind the topic), or ahead (the
// replica is newer than the records read: settled by the records since,
// settleAhead); it returns those that are not ok. $1 and $2 are the group's
// committed offsets by partition. One statement: one snapshot of the
// replica, and it writes nothing, so it holds no xid however long it reads.
func classifySQL(st staging) string {
	return `WITH committed AS (SELECT * FROM unnest($1::integer[], $2::bigint[]) AS c(part, off)),
	unconsumed AS (
		SELECT DISTINCT e.purchase_id FROM ` + st.events.String() + ` e LEFT JOIN committed c ON c.part = e.part
		WHERE c.off IS NULL OR e.off >= c.off
	), newest AS (` + st.events.LatestSQL() + `),
	expected AS (
		SELECT n.purchase_id, t.kind, t.id, n.version, n.status = 'Active' AS active, n.boost_weight
		FROM newest n, unnest(n.target_kinds, n.target_ids) AS t(kind, id)
	), replica AS (
		SELECT purchase_id, count(*) AS rows, max(version) AS version FROM catalog.promotion_contributions GROUP BY 1
	), matched AS (
		SELECT x.purchase_id, count(*) AS rows FROM expected x JOIN catalog.promotion_contributions c
			ON (c.purchase_id, c.target_kind, c.target_id, c.version, c.active, c.boost_weight)
			 = (x.purchase_id, x.kind, x.id, x.version, x.active, x.boost_weight)
		GROUP BY 1
	), classified AS (
		SELECT coalesce(n.purchase_id, r.purchase_id) AS purchase_id, n.purchase_id IS NOT NULL AS on_topic,
			r.version AS replica_version, n.version, n.status, n.boost_weight, n.target_kinds, n.target_ids,
			CASE
				WHEN n.purchase_id IS NOT NULL AND coalesce(r.rows, 0) = cardinality(n.target_ids)
					AND coalesce(m.rows, 0) = cardinality(n.target_ids) THEN 'ok'
				WHEN n.purchase_id IS NOT NULL AND r.version = n.version THEN 'drift'
				WHEN u.purchase_id IS NOT NULL AND coalesce(r.version, 0) < n.version THEN 'pending'
				WHEN r.version > coalesce(n.version, 0) THEN 'ahead'
				ELSE 'drift'
			END AS state
		FROM newest n FULL JOIN replica r ON r.purchase_id = n.purchase_id
			LEFT JOIN matched m ON m.purchase_id = n.purchase_id
			LEFT JOIN unconsumed u ON u.purchase_id = n.purchase_id
	)
	SELECT purchase_id, on_topic, replica_version, version, status, boost_weight, target_kinds, target_ids, state
	FROM classified WHERE state <> 'ok'`
}

// outcomeColumns are the columns of the outcome table, as classifySQL
// returns them.
var outcomeColumns = []string{"purchase_id", "on_topic", "replica_version", "version", "status", "boost_weight",
	"target_kinds", "target_ids", "state"}

// classify runs classifySQL and copies what it returns into the outcome
// table, a chunk per transaction; it returns how many purchases are ahead.
func (a *Auditor) classify(ctx context.Context, st staging, committed map[int32]int64) (int64, error) {
	parts, offs := make([]int64, 0, len(committed)), make([]int64, 0, len(committed))
	for p, off := range committed {
		parts, offs = append(parts, int64(p)), append(offs, off)
	}
	out, err := boost.NewCopier(ctx, boost.CopyConfig{DB: a.cfg.DB, Schema: "catalog", Table: st.prefix + "outcome",
		Columns: outcomeColumns})
	if err != nil {
		return 0, err
	}
	ahead, err := a.streamOutcome(ctx, st, pq.Array(parts), pq.Array(offs), out)
	if err := errors.Join(err, out.Close()); err != nil {
		return 0, fmt.Errorf("compare replica with the topic: %w", err)
	}
	return ahead, nil
}

// streamOutcome reads classifySQL's rows into out.
func (a *Auditor) streamOutcome(ctx context.Context, st staging, parts, offs any, out *boost.Copier) (int64, error) {
	rows, err := a.cfg.DB.QueryxContext(ctx, classifySQL(st), parts, offs)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var ahead int64
	for rows.Next() {
		var o outcome
		if err := rows.StructScan(&o); err != nil {
			return 0, err
		}
		if o.State == "ahead" {
			ahead++
		}
		if err := out.Add(o.PurchaseID, o.OnTopic, o.ReplicaVersion, o.Version, o.Status, o.Weight, o.Kinds, o.IDs,
			o.State); err != nil {
			return 0, err
		}
	}
	return ahead, rows.Err()
}

// settleAhead reads the records past the ends read, up to the partitions'
// ends now (after the replica was read), and makes each purchase ahead
// pending when they hold its replica's version or a newer one, drift
// otherwise.
func (a *Auditor) settleAhead(ctx context.Context, client *bounded.Client, st staging, read []bounded.Range) error {
	parts, err := client.Partitions(a.cfg.Topic)
	if err != nil {
		return err
	}
	ranges := make([]bounded.Range, 0, len(parts))
	for _, p := range parts {
		for _, r := range read {
			if r.Partition == p.Partition {
				ranges = append(ranges, bounded.Range{Topic: p.Topic, Partition: p.Partition, From: r.End, End: p.Newest})
			}
		}
	}
	var ignored atomic.Int64 // counted by a later check, once past the ends it reads
	copied, err := a.stage(ctx, client, st.since, ranges, &ignored, func(boost.Refused) {})
	if err != nil {
		return fmt.Errorf("since the audit began: %w", err)
	}
	// Aggregated before the first row is written: the statement holds its
	// xid only while it updates the purchases ahead.
	if _, err := a.cfg.DB.ExecContext(ctx, `UPDATE `+st.outcome()+` o SET state = s.state FROM (
			SELECT a.purchase_id, CASE WHEN coalesce(max(n.version), 0) >= a.replica_version THEN 'pending' ELSE 'drift' END AS state
			FROM `+st.outcome()+` a LEFT JOIN `+st.since.String()+` n ON n.purchase_id = a.purchase_id
			WHERE a.state = 'ahead' GROUP BY a.purchase_id, a.replica_version
		) s WHERE o.purchase_id = s.purchase_id AND o.state = 'ahead'`); err != nil {
		return fmt.Errorf("settle replica ahead of the topic: %w", err)
	}
	// After the update: a table emptied before it is still empty now.
	if err := st.since.CheckRows(ctx, a.cfg.DB, copied); err != nil {
		return fmt.Errorf("replica check: %w; run it again", err)
	}
	return nil
}

// outcome is a purchase that classifySQL did not find ok.
type outcome struct {
	PurchaseID     uuid.UUID      `db:"purchase_id"`
	OnTopic        bool           `db:"on_topic"`
	ReplicaVersion *int64         `db:"replica_version"`
	Version        *int64         `db:"version"`
	Status         *string        `db:"status"`
	Weight         *int           `db:"boost_weight"`
	Kinds          pq.StringArray `db:"target_kinds"`
	IDs            pq.StringArray `db:"target_ids"`
	State          string         `db:"state"`
}

// samples names the first drifted purchases, by id, and how each differs.
func (a *Auditor) samples(ctx context.Context, st staging) ([]PurchaseDrift, error) {
	var drifted []outcome
	if err := a.cfg.DB.SelectContext(ctx, &drifted, `SELECT `+strings.Join(outcomeColumns, ", ")+`
		FROM `+st.outcome()+` WHERE state = 'drift' ORDER BY purchase_id LIMIT $1`, a.cfg.Samples); err != nil {
		return nil, fmt.Errorf("drifted purchases: %w", err)
	}
	var out []PurchaseDrift
	for _, o := range drifted {
		if !o.OnTopic {
			out = append(out, PurchaseDrift{o.PurchaseID, "in the replica but not on the topic"})
			continue
		}
		var have []contribution
		if err := a.cfg.DB.SelectContext(ctx, &have, `SELECT purchase_id, target_kind, target_id, version, active, boost_weight
			FROM catalog.promotion_contributions WHERE purchase_id = $1 ORDER BY target_kind, target_id`, o.PurchaseID); err != nil {
			return nil, fmt.Errorf("read replica of %s: %w", o.PurchaseID, err)
		}
		l, err := o.latest()
		if err != nil {
			return nil, err
		}
		out = append(out, PurchaseDrift{o.PurchaseID, compare(l, have)})
	}
	return out, nil
}

// latest is the newest event of o.
func (o outcome) latest() (*latest, error) {
	l := &latest{version: *o.Version, active: *o.Status == string(event.StatusActive), weight: *o.Weight}
	targets := make([]event.Target, len(o.IDs))
	for i, id := range o.IDs {
		tid, err := uuid.Parse(id)
		if err != nil {
			return nil, fmt.Errorf("staged target of %s: %w", o.PurchaseID, err)
		}
		targets[i] = event.Target{TargetKind: event.TargetKind(o.Kinds[i]), TargetId: tid}
	}
	l.targets = cardTargets(targets)
	return l, nil
}

// cardTargets are the distinct Project and PropertyObject targets, in the
// replica's order (kind, then id).
func cardTargets(targets []event.Target) []event.Target {
	var out []event.Target
	for _, t := range targets {
		if (t.TargetKind == event.TargetProject || t.TargetKind == event.TargetPropertyObject) && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(x, y event.Target) int {
		if x.TargetKind != y.TargetKind {
			return cmp.Compare(x.TargetKind, y.TargetKind)
		}
		return slices.Compare(x.TargetId[:], y.TargetId[:])
	})
	return out
}

// compare names how a purchase's contributions differ from its latest event.
func compare(l *latest, have []contribution) string {
	if len(l.targets) != len(have) {
		return fmt.Sprintf("%d contributions, the latest event (version %d) has %d card targets", len(have), l.version, len(l.targets))
	}
	for i, t := range l.targets {
		c := have[i]
		switch {
		case c.Kind != string(t.TargetKind) || c.TargetID != t.TargetId:
			return fmt.Sprintf("contribution %s/%s is not a target of the latest event", c.Kind, c.TargetID)
		case c.Version != l.version:
			return fmt.Sprintf("contribution %s/%s at version %d, the latest event is version %d", c.Kind, c.TargetID, c.Version, l.version)
		case c.Active != l.active || c.Weight != l.weight:
			return fmt.Sprintf("contribution %s/%s active=%t weight=%d, the latest event says active=%t weight=%d",
				c.Kind, c.TargetID, c.Active, c.Weight, l.active, l.weight)
		}
	}
	return ""
}
