package status

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/IBM/sarama"

	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/bounded"
	"github.com/promoflow/promoflow/router/dlqreplay"
)

// Consumer is the Promotion Boost consumer's part: its group on the
// purchase topic, and the DLQ.
type Consumer struct {
	Health
	Group string `json:"group"`
	// State is the group's (Stable, PreparingRebalance, Empty, ...).
	State   string   `json:"state"`
	Members []Member `json:"members"`
	// Partitions of the topic; Behind lists those with records the group
	// has not consumed, MaxLag and SumLag count them (in offsets, the
	// relay's transaction markers among them, past 10,000 on a partition).
	Partitions int            `json:"partitions"`
	Behind     []PartitionLag `json:"behind"`
	MaxLag     int64          `json:"maxLag"`
	SumLag     int64          `json:"sumLag"`
	// MaxLagSeconds is the age of the oldest record not consumed, on any
	// partition: what catalog_promotion_lag_seconds measures in a process.
	MaxLagSeconds float64 `json:"maxLagSeconds"`
	// DeadLetters is what the DLQ holds, by error code and reason; nil
	// when it could not be read.
	DeadLetters *dlqreplay.Listing `json:"deadLetters"`
	// Stuck are the partitions whose consumer has kept failing on one
	// record for longer than Limits.Stuck: the record's offset (what
	// `promoflow dlq park` takes), since when, and the last error.
	Stuck []middleware.StuckPartition `json:"stuck"`
}

// Member is a consumer in the group.
type Member struct {
	ClientID   string  `json:"clientId"`
	Host       string  `json:"host"`
	Partitions []int32 `json:"partitions"`
}

// PartitionLag is one partition the group is behind on.
type PartitionLag struct {
	Partition int32 `json:"partition"`
	// Committed is the group's offset, -1 when it never committed one (it
	// then starts at the oldest record).
	Committed int64 `json:"committed"`
	End       int64 `json:"end"`
	Lag       int64 `json:"lag"`
	// OldestSeconds is the age of the oldest record not consumed.
	OldestSeconds float64 `json:"oldestSeconds"`
}

func (r *Reader) consumer(ctx context.Context) (s Consumer) {
	s.Group = r.cfg.ConsumerGroup
	if err := r.cfg.Kafka.Probe(ctx); err != nil {
		s.failed(err)
		return s
	}
	client, err := bounded.Dial(r.cfg.Kafka, "promoflow-status")
	if err != nil {
		s.failed(err)
		return s
	}
	defer client.Close()
	if err := s.readGroup(client); err != nil {
		s.failed(err)
		return s
	}
	oldest, err := s.readLag(ctx, client, r.cfg.Topic)
	if err != nil {
		s.failed(err)
		return s
	}
	listing, err := r.dlq.List(ctx)
	if err != nil {
		s.failed(err)
		return s
	}
	s.DeadLetters = &listing
	if s.Stuck, err = middleware.StuckInDB(ctx, r.cfg.DB, r.cfg.Topic, r.cfg.Limits.Stuck, middleware.StuckExpiryDefault); err != nil {
		s.failed(err)
		return s
	}
	s.judge(r.cfg.Limits, oldest, time.Now())
	return s
}

// readGroup reads the group's state and members.
func (s *Consumer) readGroup(client *bounded.Client) error {
	admin, err := client.Admin()
	if err != nil {
		return err
	}
	desc, err := admin.DescribeConsumerGroups([]string{s.Group})
	if err != nil {
		return fmt.Errorf("describe group %s: %w", s.Group, err)
	}
	s.Members = []Member{}
	for _, d := range desc {
		if d.Err != sarama.ErrNoError {
			return fmt.Errorf("describe group %s: %w", s.Group, d.Err)
		}
		s.State = d.State
		for _, m := range d.Members {
			member := Member{ClientID: m.ClientId, Host: m.ClientHost, Partitions: []int32{}}
			if a, err := m.GetMemberAssignment(); err == nil && a != nil {
				for _, parts := range a.Topics {
					member.Partitions = append(member.Partitions, parts...)
				}
			}
			slices.Sort(member.Partitions)
			s.Members = append(s.Members, member)
		}
	}
	slices.SortFunc(s.Members, func(a, b Member) int { return cmp.Compare(a.ClientID+a.Host, b.ClientID+b.Host) })
	return nil
}

// readLag compares the group's committed offsets with the partitions' ends,
// and reads the oldest record not consumed of each partition behind. A
// partition whose offsets past the committed one hold no record to read (the
// relay's transaction markers, aborted records) is not behind, and a lag of
// up to lagCountMost offsets is counted in records (the markers left out).
func (s *Consumer) readLag(ctx context.Context, client *bounded.Client, topic string) (time.Duration, error) {
	parts, err := client.Partitions(topic)
	if err != nil {
		return 0, err
	}
	committed, err := client.Committed(s.Group, parts)
	if err != nil {
		return 0, err
	}
	s.Partitions, s.Behind = len(parts), []PartitionLag{}
	var (
		ranges []bounded.Range
		behind []PartitionLag
	)
	for _, p := range parts {
		r, off := p.Whole(), int64(-1)
		if c, ok := committed[p.Partition]; ok {
			off, r.From = c, max(c, r.From)
		}
		if r.Len() == 0 {
			continue
		}
		ranges = append(ranges, r)
		behind = append(behind, PartitionLag{Partition: p.Partition, Committed: off, End: p.Newest, Lag: r.Len()})
	}
	heads, err := client.Heads(ctx, ranges)
	if err != nil {
		return 0, err
	}
	var oldest time.Duration
	for i, b := range behind {
		ts, ok := heads[b.Partition]
		if !ok {
			continue
		}
		if b.Lag <= lagCountMost {
			if b.Lag, err = client.Records(ranges[i]); err != nil {
				return 0, err
			}
		}
		age := max(time.Since(ts), 0)
		b.OldestSeconds = seconds(age)
		oldest = max(oldest, age)
		s.Behind = append(s.Behind, b)
		s.SumLag += b.Lag
		s.MaxLag = max(s.MaxLag, b.Lag)
	}
	s.MaxLagSeconds = seconds(oldest)
	return oldest, nil
}

// lagCountMost is the largest lag, in offsets, that readLag counts record by
// record: a few fetches of the partition.
const lagCountMost = 10_000

// judge mirrors CatalogPromotionLagHigh (the oldest record not consumed is
// older than the SLO) and CatalogPromotionDeadLetters (a dead letter within
// the window).
func (s *Consumer) judge(l Limits, oldest time.Duration, now time.Time) {
	if oldest > l.Lag {
		s.problem("CatalogPromotionLagHigh", "the group is %d records behind on %d of %d partitions; the oldest not consumed is %s old (limit %s)",
			s.SumLag, len(s.Behind), s.Partitions, oldest.Round(time.Second), l.Lag)
	}
	for _, p := range s.Stuck {
		s.problem("CatalogPartitionStuck", "partition %d has not moved past offset %d for %s (%d attempts): %s "+
			"(docs/runbooks/partition-stuck.md; `promoflow dlq park --partition %d --offset %d --reason ...`)",
			p.Partition, p.Offset, now.Sub(p.Since).Round(time.Second), p.Attempts, p.Error, p.Partition, p.Offset)
	}
	if len(s.Members) == 0 {
		s.note("the group has no member: no catalog process consumes (or catalog.promotions.enabled is false)")
	}
	if d := s.DeadLetters; d != nil && len(d.Rows) > 0 {
		newest := d.Rows[0].Newest
		for _, row := range d.Rows {
			newest = latest(newest, row.Newest)
		}
		if age := now.Sub(newest); age <= l.DeadLetterWindow {
			s.problem("CatalogPromotionDeadLetters", "an event was dead-lettered %s ago (window %s); the DLQ holds %d records (docs/runbooks/dlq-replay.md)",
				max(age, 0).Round(time.Second), l.DeadLetterWindow, d.Records)
		}
	}
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
