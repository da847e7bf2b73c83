package audit

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/google/uuid"

	"github.com/promoflow/promoflow/handlers/boost"
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

// Replica reads the whole purchase topic up to its end now into a staging
// table of PostgreSQL (COPY, a chunk per short transaction), and compares
// each purchase's newest event with the replica's contributions in one SQL
// statement that writes nothing: its memory does not grow with the topic,
// and no transaction of it holds an xid for longer than a chunk. A purchase
// whose replica differs is pending, not drift, when the catalog consumer has
// not consumed one of its records yet and the replica is behind the topic; a replica at the topic's newest version is compared,
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
