//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os/exec"
	"sort"
	"time"

	"github.com/IBM/sarama"

	"github.com/promoflow/promoflow/handlers/outbox"
	"github.com/promoflow/promoflow/router/bounded"
)

// checkEvents runs the checker (checker_test.go) over the scenario's topic,
// its purchase table, the ids its API answered 201 for and the keys of its
// malformed records.
func (e *env) checkEvents() []string {
	removed, records, err := readTopic(e.ctx, e.s.cluster(), e.topic)
	if err != nil {
		return []string{err.Error()}
	}
	rows, err := readPurchases(e.ctx, e.db)
	if err != nil {
		return []string{err.Error()}
	}
	e.mu.Lock()
	ev := evidence{removed: removed, records: records, rows: rows, created: maps.Clone(e.created), malformed: maps.Clone(e.malformed),
		lost: maps.Clone(e.lost), reconciled: maps.Clone(e.reconciled), phantoms: map[string]bool{}}
	for _, r := range records {
		if from, ok := e.phantomFrom[r.Partition]; ok && r.Offset >= from && r.Offset < e.phantomTo[r.Partition] {
			ev.phantoms[r.MessageID] = true
		}
	}
	e.mu.Unlock()
	return texts(ev.violations())
}

// checkCards compares every card with the promotion truth, and wants many
// of them to carry a non-zero one.
func (e *env) checkCards() []string {
	cards, err := readCards(e.ctx, e.db)
	if err != nil {
		return []string{err.Error()}
	}
	return texts(checkCards(cards))
}

func texts(vs []violation) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.String()
	}
	return out
}

// checkAudit runs `promoflow audit --replica` and wants no drift and nothing pending.
func (e *env) checkAudit() []string {
	ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, e.s.bin, "audit", "--replica", "--json", "--database-url", e.dbURL,
		"--kafka-brokers", e.s.brokers, "--topic", e.topic, "--consumer-group", e.group, "--log-level", "error").Output()
	var rep struct {
		Cards   struct{ Drifted int }
		Replica struct{ Drifted, Pending int }
	}
	if jerr := json.Unmarshal(out, &rep); jerr != nil {
		return []string{fmt.Sprintf("audit: %v %v: %s", err, jerr, out)}
	}
	var bad []string
	if rep.Cards.Drifted > 0 || rep.Replica.Drifted > 0 || rep.Replica.Pending > 0 {
		bad = append(bad, fmt.Sprintf("audit: %d cards drifted, replica %d drifted, %d pending", rep.Cards.Drifted,
			rep.Replica.Drifted, rep.Replica.Pending))
	}
	return bad
}

// checkAlive wants every process that should run to run.
func (e *env) checkAlive() []string {
	var bad []string
	for _, p := range e.all() {
		if !p.alive() {
			bad = append(bad, p.name+" is not running (log "+p.logs+")")
		}
	}
	return bad
}

// idle says what work is left: due purchases still Active, outbox events
// not relayed, records the consumer group has not committed.
func (e *env) idle() (string, bool) {
	var due int
	if err := e.db.Get(&due, `SELECT count(*) FROM promotion.promotion_purchases WHERE status = 'Active' AND ends_at <= now()`); err != nil {
		return "due purchases: " + err.Error(), false
	}
	if due > 0 {
		return fmt.Sprintf("%d due purchases still Active", due), false
	}
	stats, err := outbox.ReadStats(e.ctx, e.db)
	if err != nil {
		return err.Error(), false
	}
	if stats.Backlog > 0 {
		return fmt.Sprintf("%d outbox events not relayed", stats.Backlog), false
	}
	lag, err := e.consumerLag()
	if err != nil {
		return err.Error(), false
	}
	if lag > 0 {
		return fmt.Sprintf("consumer group %s: %d records not committed", e.group, lag), false
	}
	return "", true
}

// topicEnds is the end offset of each partition of the scenario's topic.
func (e *env) topicEnds() (map[int32]int64, error) {
	client, err := sarama.NewClient(e.s.cluster().Brokers, e.s.cluster().ClientConfig("promoflow-faults"))
	if err != nil {
		return nil, fmt.Errorf("topic ends: %w", err)
	}
	defer client.Close()
	parts, err := client.Partitions(e.topic)
	if err != nil {
		return nil, fmt.Errorf("topic ends: %w", err)
	}
	ends := make(map[int32]int64, len(parts))
	for _, p := range parts {
		if ends[p], err = client.GetOffset(e.topic, p, sarama.OffsetNewest); err != nil {
			return nil, fmt.Errorf("topic ends: %w", err)
		}
	}
	return ends, nil
}

// consumerLag counts the records of the scenario's topic that a
// read_committed consumer delivers and the group has not committed. The
// relay's transaction markers take an offset each and are never delivered,
// so a group that consumed everything may stay one offset short of a
// partition's end: as `promoflow status` does, a small lag is counted record
// by record (the markers left out), and a larger one in offsets.
func (e *env) consumerLag() (int64, error) {
	client, err := bounded.Dial(e.s.cluster(), "promoflow-faults")
	if err != nil {
		return 0, fmt.Errorf("consumer lag: %w", err)
	}
	defer client.Close()
	parts, err := client.Partitions(e.topic)
	if err != nil {
		return 0, fmt.Errorf("consumer lag: %w", err)
	}
	committed, err := client.Committed(e.group, parts)
	if err != nil {
		return 0, fmt.Errorf("consumer lag: %w", err)
	}
	var lag int64
	for _, p := range parts {
		r := p.Whole()
		if c, ok := committed[p.Partition]; ok {
			r.From = max(c, r.From)
		}
		if r.Len() == 0 {
			continue
		}
		if r.Len() > lagCountMost {
			lag += r.Len()
			continue
		}
		n, err := client.Records(r)
		if err != nil {
			return 0, fmt.Errorf("consumer lag: %w", err)
		}
		lag += n
	}
	return lag, nil
}

// lagCountMost is the largest lag, in offsets, that consumerLag counts
// record by record.
const lagCountMost = 1_000

// quiesce waits until nothing is left to expire, relay or consume (up to
// timeout), then until every invariant holds (up to 30s more), and returns
// how long that took. Violations still present then are recorded, up to 10
// of each check.
func (e *env) quiesce(timeout time.Duration) time.Duration {
	var left string
	took, ok := eventually(e.ctx, timeout, func() bool {
		var idle bool
		left, idle = e.idle()
		return idle
	})
	if !ok {
		e.violate("not quiescent after %s: %s", timeout, left)
	}
	var last [][]string
	more, ok := eventually(e.ctx, 30*time.Second, func() bool {
		last = nil
		for _, check := range []func() []string{e.checkAlive, e.checkEvents, e.checkCards, e.checkAudit} {
			if bad := check(); len(bad) > 0 {
				last = append(last, bad)
			}
		}
		return len(last) == 0
	})
	if !ok {
		// Up to 10 of each check's.
		for _, bad := range last {
			sort.Strings(bad)
			for i, v := range bad {
				if i == 10 {
					e.violate("... and %d more", len(bad)-10)
					break
				}
				e.violate("%s", v)
			}
		}
	}
	return took + more
}

// checkDrift asks Prometheus for the most drifted cards each catalog process
// reported from the scenario's start until now: it must be 0. Prometheus
// must first hold a sample of every catalog process taken after this call.
func (e *env) checkDrift() {
	from := time.Now()
	for _, p := range e.catalogs {
		series := fmt.Sprintf(`catalog_promotion_drift_cards{job="catalog",instance=%q}`, p.internal)
		var err error
		if _, ok := eventually(e.ctx, 30*time.Second, func() bool {
			var at float64
			at, err = e.s.prom.one("timestamp(" + series + ")")
			return err == nil && at >= float64(from.Unix())
		}); err != nil {
			e.violate("drift of %s: %v", p.name, err)
			continue
		} else if !ok {
			e.violate("drift of %s: Prometheus has no sample taken after the scenario", p.name)
			continue
		}
		window := int(math.Ceil(time.Since(e.started).Seconds()))
		drift, err := e.s.prom.one(fmt.Sprintf("max_over_time(%s[%ds])", series, window))
		switch {
		case err != nil:
			e.violate("drift of %s: %v", p.name, err)
		case drift != 0:
			e.violate("%s reported catalog_promotion_drift_cards up to %v during the scenario", p.name, drift)
		}
	}
}

// finish stops every process gracefully (each must exit 0) and reads their
// logs: a panic or a fatal error in any of them is a violation.
func (e *env) finish() {
	e.stopAll()
	for _, p := range append(e.all(), e.retired...) {
		lines, err := p.crashes()
		if err != nil {
			e.violate("read the log of %s: %v", p.name, err)
		}
		for _, l := range lines {
			e.violate("%s crashed: %s", p.name, l)
		}
		e.t.Logf("%s exits: %v", p.name, p.exitLog())
	}
}
