package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/lib/pq"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/bounded"
)

// The comparison of the staged topic with the replica: each purchase's
// newest event against its contributions, the purchases that differ written
// to the outcome table, those ahead of the records read settled by the
// records since, and the drifted ones described.

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
