package dlqreplay

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/bounded"
)

// reasonChars bounds the reason a listing groups by: reasons that differ only
// in their detail (a byte offset in a JSON error) fall into one row.
const reasonChars = 120

// Row is one kind of dead letter: an error code and a reason.
type Row struct {
	Code   string `json:"code"`
	Reason string `json:"reason"`
	Count  int64  `json:"count"`
	// Parked of them were replayed MaxReplays times and are no longer replayed.
	Parked int64 `json:"parked"`
	// Oldest and Newest are the record timestamps of the first and last of them.
	Oldest time.Time `json:"oldest"`
	Newest time.Time `json:"newest"`
}

// Listing is what the DLQ holds, by error code and reason, most first.
type Listing struct {
	Topic      string `json:"topic"`
	Partitions int    `json:"partitions"`
	Records    int64  `json:"records"`
	Rows       []Row  `json:"rows"`
}

// List reads the whole DLQ, up to its end now, and writes nothing: no group,
// no commit. Filters and Max of the config do not apply; MaxReplays decides
// what counts as parked.
func (r *Replayer) List(ctx context.Context) (Listing, error) {
	client, err := bounded.Dial(r.cfg.Kafka, "promoflow-dlq-list")
	if err != nil {
		return Listing{}, err
	}
	defer client.Close()
	parts, err := client.Partitions(r.cfg.DLQTopic)
	if err != nil {
		return Listing{}, err
	}
	ranges := make([]bounded.Range, len(parts))
	for i, p := range parts {
		ranges[i] = p.Whole()
	}
	r.progress.Plan(ranges)
	var mu sync.Mutex
	rows := map[[2]string]*Row{}
	err = client.Read(ctx, ranges, func(_ context.Context, rec *sarama.ConsumerMessage) error {
		msg, err := kafka.DefaultMarshaler{}.Unmarshal(rec)
		if err != nil {
			return err
		}
		r.progress.Read.Add(1)
		key := [2]string{cmp.Or(msg.Metadata.Get(middleware.HeaderDLQErrorCode), "(none)"),
			clip(msg.Metadata.Get(middleware.HeaderDLQReason), reasonChars)}
		mu.Lock()
		defer mu.Unlock()
		row := rows[key]
		if row == nil {
			row = &Row{Code: key[0], Reason: key[1], Oldest: rec.Timestamp, Newest: rec.Timestamp}
			rows[key] = row
		}
		row.Count++
		if replays(msg) >= r.cfg.MaxReplays {
			row.Parked++
		}
		if rec.Timestamp.Before(row.Oldest) {
			row.Oldest = rec.Timestamp
		}
		if rec.Timestamp.After(row.Newest) {
			row.Newest = rec.Timestamp
		}
		return nil
	}, &r.progress)
	if err != nil {
		return Listing{}, fmt.Errorf("list %s: %w", r.cfg.DLQTopic, err)
	}
	out := Listing{Topic: r.cfg.DLQTopic, Partitions: len(parts)}
	for _, row := range rows {
		out.Records += row.Count
		out.Rows = append(out.Rows, *row)
	}
	slices.SortFunc(out.Rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Code, b.Code), cmp.Compare(a.Reason, b.Reason))
	})
	return out, nil
}

func clip(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}
