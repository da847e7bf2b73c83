// Package dlqreplay replays the Promotion Boost DLQ to the catalog-only
// replay topic with a Watermill forwarder, and lists what the DLQ holds.
//
// A replay cannot amplify the DLQ, even while the consumer runs and dead-
// letters a replayed record again: it reads each partition only up to the end
// it had when the replay began, every forwarded record carries an incremented
// x-dlq-replay-count, and a record replayed MaxReplays times is parked (left
// in the DLQ, counted) instead of forwarded.
//
// Each original is replayed once, whatever the consumer group: the ledger
// (ledger.go, catalog.dlq_replays) records a dead letter's first origin
// once the replay topic acknowledged it, and later runs skip every copy of
// it; Force replays again on purpose. TestDLQReplay_EachOriginalOnceAcrossGroups
// runs three rounds in three groups.
package dlqreplay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/promoflow/promoflow/handlers/event"
	"github.com/promoflow/promoflow/middleware"
	"github.com/promoflow/promoflow/router/bounded"
	"github.com/promoflow/promoflow/router/kafkakit"
)

// ErrGroupBusy is another replay running in the same consumer group.
var ErrGroupBusy = errors.New("another dlq-replay is running in this consumer group")

// Result is what a replay did.
type Result struct {
	Group string
	bounded.Counts
	Duration time.Duration
}

// Replayer runs one replay.
type Replayer struct {
	cfg      Config
	progress bounded.Progress
}

// New validates cfg (after defaults) and returns a Replayer.
func New(cfg Config) (*Replayer, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Replayer{cfg: cfg}, nil
}

// Group is the consumer group that keeps the replay's position.
func (r *Replayer) Group() string { return r.cfg.Group }

// Progress is the replay's live progress, for a progress bar.
func (r *Replayer) Progress() *bounded.Progress { return &r.progress }

// Run replays from the group's committed position to the end each partition
// had at the start, committing as it goes, and returns when that end is
// reached, Max records were replayed, or ctx ended. A dry run reads the same
// records and publishes and commits nothing.
func (r *Replayer) Run(ctx context.Context) (Result, error) {
	start := time.Now()
	ctx, span := r.startRun(ctx)
	res := func(err error) (Result, error) {
		r.endRun(span, err)
		return Result{Group: r.cfg.Group, Counts: r.progress.Snapshot(), Duration: time.Since(start)}, err
	}
	if r.cfg.DB == nil {
		return res(ErrNoLedger)
	}
	client, err := bounded.Dial(r.cfg.Kafka, "promoflow-dlq-replay")
	if err != nil {
		return res(err)
	}
	defer client.Close()
	admin, err := client.Admin()
	if err != nil {
		return res(err)
	}
	if !r.cfg.DryRun {
		if err := groupIdle(admin, r.cfg.Group); err != nil {
			return res(err)
		}
	}
	parts, err := client.Partitions(r.cfg.DLQTopic)
	if err != nil {
		return res(err)
	}
	if !r.cfg.DryRun {
		if _, err := client.Partitions(r.cfg.ReplayTopic); err != nil {
			return res(fmt.Errorf("replay topic: %w (a catalog process creates it at start)", err))
		}
	}
	ranges, err := remaining(client, r.cfg.Group, parts)
	if err != nil {
		return res(err)
	}
	r.progress.Plan(ranges)
	r.cfg.Log.Info("dlq replay starting", "group", r.cfg.Group, "dryRun", r.cfg.DryRun,
		"offsets", r.progress.Snapshot().OffsetsTotal, "maxReplays", r.cfg.MaxReplays)
	if len(ranges) == 0 {
		return res(nil)
	}
	if r.cfg.DryRun {
		return res(r.dryRun(ctx, client, ranges))
	}
	return res(r.forward(ctx, client, parts, ranges, trace.SpanContextFromContext(ctx)))
}

// groupIdle refuses a group in which another replay runs, before joining it.
func groupIdle(admin sarama.ClusterAdmin, group string) error {
	desc, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil {
		return fmt.Errorf("describe group %s: %w", group, err)
	}
	for _, d := range desc {
		if len(d.Members) > 0 {
			return fmt.Errorf("%w: group %s has %d member(s) in state %s; wait for it to finish, or give --group",
				ErrGroupBusy, group, len(d.Members), d.State)
		}
	}
	return nil
}

// remaining is, per partition, the records from the group's committed offset
// to the partition's end now.
func remaining(client *bounded.Client, group string, parts []bounded.Partition) ([]bounded.Range, error) {
	committed, err := client.Committed(group, parts)
	if err != nil {
		return nil, err
	}
	var out []bounded.Range
	for _, p := range parts {
		r := p.Whole()
		if off, ok := committed[p.Partition]; ok && off > r.From {
			r.From = off
		}
		if r.Len() > 0 {
			out = append(out, r)
		}
	}
	return out, nil
}

// forward runs the Watermill forwarder from the group source to the replay
// topic, keyed by each record's own key; each record's span links to run.
// client fetches the records of dead letters by reference.
func (r *Replayer) forward(ctx context.Context, client *bounded.Client, parts []bounded.Partition, ranges []bounded.Range,
	run trace.SpanContext) error {
	wlog := watermill.NewSlogLogger(r.cfg.Log)
	// The replay topic's own size limit: a record that fitted its topic may
	// exceed Sarama's default (1 MiB) with the replay's headers.
	pub, _, err := r.cfg.Kafka.NewLimitedPublisher(ctx, r.cfg.ReplayTopic, "promoflow-dlq-replay",
		kafkakit.KeepKeyMarshaler{Fallback: middleware.DLQPartitionKey}, wlog)
	if err != nil {
		return fmt.Errorf("replay publisher: %w", err)
	}
	defer pub.Close()
	src := newSource(r.cfg, client, &r.progress, len(parts), ranges)
	fwd, err := forwarder.NewForwarder(src, tracingPublisher{pub, run}, wlog, forwarder.Config{
		ForwarderTopic: r.cfg.DLQTopic,
		Middlewares:    []message.HandlerMiddleware{r.progress.CountReplayed},
	})
	if err != nil {
		return fmt.Errorf("replay forwarder: %w", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- fwd.Run(ctx) }()
	select {
	case <-src.finished: // done, capped or failed: stop the forwarder
		err = errors.Join(fwd.Close(), <-errc)
	case err = <-errc: // ctx ended
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return src.err()
}

// dryRun reads the same records without the group and logs each verdict.
func (r *Replayer) dryRun(ctx context.Context, client *bounded.Client, ranges []bounded.Range) error {
	return client.Read(ctx, ranges, func(ctx context.Context, rec *sarama.ConsumerMessage) error {
		msg, err := kafka.DefaultMarshaler{}.Unmarshal(rec)
		if err != nil {
			return err
		}
		r.progress.Read.Add(1)
		v, err := r.cfg.checkLedger(ctx, rec, msg, r.cfg.decide(msg))
		if err != nil {
			return err
		}
		if v == replay {
			if _, _, err = r.cfg.dereference(ctx, client, rec, msg); errors.Is(err, errBrokenReference) {
				v = broken
			} else if err != nil {
				return err
			}
		}
		if v == skip {
			return nil
		}
		r.progress.Matched.Add(1)
		what := "would park"
		switch {
		case v == park:
			r.progress.Parked.Add(1)
		case v == broken:
			r.progress.Skipped.Add(1)
			what = "would skip"
		case v == done:
			r.progress.Skipped.Add(1)
			what = "would skip, replayed already"
		case r.capReached():
			return nil
		default:
			// In a dry run, replayed counts what a real run would forward.
			r.progress.Replayed.Add(1)
			what = "would replay"
		}
		attrs := []any{"partition", rec.Partition, "offset", rec.Offset, "MessageId", msg.UUID,
			"PurchaseId", msg.Metadata.Get(event.HeaderAggregateID), "replays", replays(msg),
			"code", msg.Metadata.Get(middleware.HeaderDLQErrorCode), "reason", msg.Metadata.Get(middleware.HeaderDLQReason)}
		if v == broken {
			attrs = append(attrs, "error", err.Error())
		}
		r.cfg.Log.Info(what, attrs...)
		return nil
	}, &r.progress)
}

func (r *Replayer) capReached() bool {
	return r.cfg.Max > 0 && r.progress.Replayed.Load() >= r.cfg.Max
}

// envelope wraps a copy of msg for destination the way forwarder.Publisher
// does, with its replay count incremented and its record key in its context.
func envelope(destination string, msg *message.Message, key []byte) (*message.Message, error) {
	var c capture
	clean := message.NewMessage(msg.UUID, msg.Payload)
	for k, v := range msg.Metadata {
		clean.Metadata.Set(k, v)
	}
	clean.Metadata.Set(middleware.HeaderDLQReplayCount, strconv.Itoa(replays(msg)+1))
	if err := forwarder.NewPublisher(&c, forwarder.PublisherConfig{}).Publish(destination, clean); err != nil {
		return nil, err
	}
	c.msg.SetContext(kafkakit.WithKey(msg.Context(), key))
	return c.msg, nil
}

type capture struct{ msg *message.Message }

func (c *capture) Publish(_ string, msgs ...*message.Message) error {
	c.msg = msgs[0]
	return nil
}

func (c *capture) Close() error { return nil }
