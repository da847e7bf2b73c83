//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"sort"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/router/bounded"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// record is one purchase event as it lies on the topic.
type record struct {
	id      string // MessageId
	version int64
	status  event.Status
}

// topicEvents reads the purchase topic up to its end now, per purchase in
// partition order (a purchase's events share its key, hence a partition).
func (e *env) topicEvents() (map[uuid.UUID][]record, int, error) {
	client, err := bounded.Dial(kafkakit.Cluster{Brokers: []string{e.s.brokers}}, "promoflow-faults")
	if err != nil {
		return nil, 0, err
	}
	defer client.Close()
	parts, err := client.Partitions(e.topic)
	if err != nil {
		return nil, 0, err
	}
	ranges := make([]bounded.Range, len(parts))
	for i, p := range parts {
		ranges[i] = p.Whole()
	}
	out := map[uuid.UUID][]record{}
	total := 0
	var mu = make(chan struct{}, 1)
	err = client.Read(e.ctx, ranges, func(_ context.Context, rec *sarama.ConsumerMessage) error {
		mu <- struct{}{}
		defer func() { <-mu }()
		total++
		ev, err := event.Parse(rec.Value)
		if err != nil {
			return nil // scenario 9's records
		}
		var id string
		for _, h := range rec.Headers {
			if string(h.Key) == "_watermill_message_uuid" {
				id = string(h.Value)
			}
		}
		out[ev.PurchaseId] = append(out[ev.PurchaseId], record{id: id, version: ev.Version, status: ev.Status})
		return nil
	}, nil)
	return out, total, err
}

// checkEvents: every purchase's last event equals its row, versions rise per
// purchase, and there is at most one terminal event (a redelivered record,
// same MessageId, is the same event).
func (e *env) checkEvents() []string {
	var bad []string
	events, _, err := e.topicEvents()
	if err != nil {
		return []string{"read topic: " + err.Error()}
	}
	var rows []struct {
		ID      uuid.UUID    `db:"id"`
		Status  event.Status `db:"status"`
		Version int64        `db:"version"`
	}
	if err := e.db.Select(&rows, `SELECT id, status, version FROM promotion.promotion_purchases`); err != nil {
		return []string{"read purchases: " + err.Error()}
	}
	for _, row := range rows {
		recs := events[row.ID]
		if len(recs) == 0 {
			bad = append(bad, fmt.Sprintf("purchase %s (%s v%d) has no event on the topic", row.ID, row.Status, row.Version))
			continue
		}
		seen := map[string]bool{}
		var last record
		terminal := 0
		for _, r := range recs {
			if seen[r.id] {
				continue
			}
			seen[r.id] = true
			if r.version <= last.version {
				bad = append(bad, fmt.Sprintf("purchase %s: version %d after %d", row.ID, r.version, last.version))
			}
			if r.status.Terminal() {
				terminal++
			}
			last = r
		}
		if terminal > 1 {
			bad = append(bad, fmt.Sprintf("purchase %s: %d terminal events", row.ID, terminal))
		}
		if last.version != row.Version || last.status != row.Status {
			bad = append(bad, fmt.Sprintf("purchase %s: last event %s v%d, row %s v%d", row.ID, last.status, last.version, row.Status, row.Version))
		}
	}
	return bad
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

// truthSQL lists the cards whose boost is not what promotion's own table
// says: the sum of the weights of the Active purchases that target them (a
// published object gets its project's too).
const truthSQL = `WITH active AS (
	SELECT p.boost_weight AS w, t->>'TargetKind' AS kind, (t->>'TargetId')::uuid AS id
	FROM promotion.promotion_purchases p, jsonb_array_elements(p.targets) t WHERE p.status = 'Active'
), sums AS (SELECT kind, id, sum(w)::int AS s FROM active GROUP BY kind, id)
SELECT 'Project' AS kind, c.id, c.promotion_boost AS have, coalesce(s.s, 0) AS want
FROM catalog.project_cards c LEFT JOIN sums s ON s.kind = 'Project' AND s.id = c.id
WHERE c.promotion_boost <> coalesce(s.s, 0)
UNION ALL
SELECT 'PropertyObject', o.id, o.promotion_boost,
	coalesce(own.s, 0) + CASE WHEN o.published THEN coalesce(pr.s, 0) ELSE 0 END
FROM catalog.property_object_cards o
LEFT JOIN sums own ON own.kind = 'PropertyObject' AND own.id = o.id
LEFT JOIN sums pr ON pr.kind = 'Project' AND pr.id = o.project_id
WHERE o.promotion_boost <> coalesce(own.s, 0) + CASE WHEN o.published THEN coalesce(pr.s, 0) ELSE 0 END`

// checkCards compares every card with the promotion truth.
func (e *env) checkCards() []string {
	var rows []struct {
		Kind string    `db:"kind"`
		ID   uuid.UUID `db:"id"`
		Have int       `db:"have"`
		Want int       `db:"want"`
	}
	if err := e.db.Select(&rows, truthSQL); err != nil {
		return []string{"recompute cards: " + err.Error()}
	}
	var bad []string
	for _, r := range rows {
		bad = append(bad, fmt.Sprintf("%s card %s: boost %d, promotion truth %d", r.Kind, r.ID, r.Have, r.Want))
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

// quiesce waits until nothing is left to expire, relay or consume and every
// invariant holds, and returns how long that took. Violations still present
// at the timeout are recorded.
func (e *env) quiesce(timeout time.Duration) time.Duration {
	var last []string
	took, ok := eventually(e.ctx, timeout, func() bool {
		var due int
		_ = e.db.Get(&due, `SELECT count(*) FROM promotion.promotion_purchases WHERE status = 'Active' AND ends_at <= now()`)
		if due > 0 {
			last = []string{fmt.Sprintf("%d due purchases still Active", due)}
			return false
		}
		for _, check := range []func() []string{e.checkAlive, e.checkEvents, e.checkCards, e.checkAudit} {
			if last = check(); len(last) > 0 {
				return false
			}
		}
		return true
	})
	if !ok {
		sort.Strings(last)
		for i, v := range last {
			if i == 10 {
				e.violate("... and %d more", len(last)-10)
				break
			}
			e.violate("%s", v)
		}
	}
	return took
}
