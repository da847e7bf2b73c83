package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/bounded"
)

// ReplicaReport is the replica's check against the purchase topic.
type ReplicaReport struct {
	// Purchases seen on the topic, of which Pending have a record the catalog
	// consumer has not consumed yet (not compared) and Drifted differ.
	Purchases int64 `json:"purchases"`
	Pending   int64 `json:"pending"`
	Drifted   int   `json:"drifted"`
	// Unreadable records break the contract (they went to the DLQ).
	Unreadable int64           `json:"unreadable"`
	Samples    []PurchaseDrift `json:"samples,omitempty"`
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
	pending bool
}

type contribution struct {
	PurchaseID uuid.UUID `db:"purchase_id"`
	Kind       string    `db:"target_kind"`
	TargetID   uuid.UUID `db:"target_id"`
	Version    int64     `db:"version"`
	Active     bool      `db:"active"`
	Weight     int       `db:"boost_weight"`
}

// Replica reads the whole purchase topic up to its end now, keeps each
// purchase's newest event, and compares the replica's contributions with it.
// Records the consumer group has not consumed yet make their purchase pending.
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
	want, ends, err := a.readTopic(ctx, client, &r)
	if err != nil {
		return r, err
	}
	have, err := a.readReplica(ctx)
	if err != nil {
		return r, err
	}
	later, err := a.readSince(ctx, client, ends, ahead(want, have))
	if err != nil {
		return r, err
	}
	r.Purchases = int64(len(want))
	var drift []PurchaseDrift
	for id, l := range want {
		if l.pending || later.holds(id, have[id]) {
			r.Pending++
			continue
		}
		if problem := compare(l, have[id]); problem != "" {
			drift = append(drift, PurchaseDrift{id, problem})
		}
	}
	for id, cs := range have {
		switch _, ok := want[id]; {
		case ok:
		case later.holds(id, cs):
			r.Purchases++
			r.Pending++
		default:
			drift = append(drift, PurchaseDrift{id, "in the replica but not on the topic"})
		}
	}
	slices.SortFunc(drift, func(x, y PurchaseDrift) int { return slices.Compare(x.PurchaseId[:], y.PurchaseId[:]) })
	r.Drifted = len(drift)
	r.Samples = drift[:min(len(drift), a.cfg.Samples)]
	return r, nil
}

// readTopic reads every record up to the partitions' ends now, and returns
// each purchase's newest event and the ranges it read.
func (a *Auditor) readTopic(ctx context.Context, client *bounded.Client, r *ReplicaReport) (map[uuid.UUID]*latest, []bounded.Range, error) {
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
	committed, err := admin.ListConsumerGroupOffsets(a.cfg.ConsumerGroup, map[string][]int32{a.cfg.Topic: ids})
	if err != nil {
		return nil, nil, fmt.Errorf("offsets of group %s: %w", a.cfg.ConsumerGroup, err)
	}
	consumed := func(p int32, offset int64) bool {
		b := committed.GetBlock(a.cfg.Topic, p)
		return b != nil && offset < b.Offset
	}
	var mu sync.Mutex
	want := map[uuid.UUID]*latest{}
	err = client.Read(ctx, ranges, func(_ context.Context, rec *sarama.ConsumerMessage) error {
		ev, err := event.Parse(rec.Value)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			r.Unreadable++
			return nil
		}
		l := want[ev.PurchaseId]
		if l == nil {
			l = &latest{}
			want[ev.PurchaseId] = l
		}
		l.pending = l.pending || !consumed(rec.Partition, rec.Offset)
		if ev.Version >= l.version {
			*l = latest{version: ev.Version, active: ev.Status == event.StatusActive, weight: ev.BoostWeight,
				targets: cardTargets(ev.Targets), pending: l.pending}
		}
		return nil
	}, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", a.cfg.Topic, err)
	}
	return want, ranges, nil
}

// newest is the highest version of a purchase's contributions, 0 for none.
func newest(cs []contribution) int64 {
	var v int64
	for _, c := range cs {
		v = max(v, c.Version)
	}
	return v
}

// ahead names the purchases whose replica is newer than the records read:
// a higher version, or no record at all.
func ahead(want map[uuid.UUID]*latest, have map[uuid.UUID][]contribution) map[uuid.UUID]bool {
	out := map[uuid.UUID]bool{}
	for id, cs := range have {
		if l, ok := want[id]; !ok || newest(cs) > l.version {
			out[id] = true
		}
	}
	return out
}

// versionsSince maps a purchase to the newest version its records since the
// ends read hold.
type versionsSince map[uuid.UUID]int64

// holds reports whether the records since the ends hold the version of the
// replica's contributions cs of purchase id, or a newer one.
func (v versionsSince) holds(id uuid.UUID, cs []contribution) bool {
	seen, ok := v[id]
	return ok && len(cs) > 0 && seen >= newest(cs)
}

// readSince reads the records past the ends read, up to the partitions'
// ends now, for the purchases in ids only; nothing when ids is empty.
func (a *Auditor) readSince(ctx context.Context, client *bounded.Client, read []bounded.Range, ids map[uuid.UUID]bool) (versionsSince, error) {
	out := versionsSince{}
	if len(ids) == 0 {
		return out, nil
	}
	parts, err := client.Partitions(a.cfg.Topic)
	if err != nil {
		return nil, err
	}
	ranges := make([]bounded.Range, 0, len(parts))
	for _, p := range parts {
		for _, r := range read {
			if r.Partition == p.Partition {
				ranges = append(ranges, bounded.Range{Topic: p.Topic, Partition: p.Partition, From: r.End, End: p.Newest})
			}
		}
	}
	var mu sync.Mutex
	err = client.Read(ctx, ranges, func(_ context.Context, rec *sarama.ConsumerMessage) error {
		ev, err := event.Parse(rec.Value)
		if err != nil || !ids[ev.PurchaseId] {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		out[ev.PurchaseId] = max(out[ev.PurchaseId], ev.Version)
		return nil
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("read %s since the audit began: %w", a.cfg.Topic, err)
	}
	return out, nil
}

func (a *Auditor) readReplica(ctx context.Context) (map[uuid.UUID][]contribution, error) {
	rows, err := a.cfg.DB.QueryxContext(ctx, `SELECT purchase_id, target_kind, target_id, version, active, boost_weight
		FROM catalog.promotion_contributions ORDER BY purchase_id, target_kind, target_id`)
	if err != nil {
		return nil, fmt.Errorf("read replica: %w", err)
	}
	defer rows.Close()
	have := map[uuid.UUID][]contribution{}
	for rows.Next() {
		var c contribution
		if err := rows.StructScan(&c); err != nil {
			return nil, fmt.Errorf("read replica: %w", err)
		}
		have[c.PurchaseID] = append(have[c.PurchaseID], c)
	}
	return have, rows.Err()
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
