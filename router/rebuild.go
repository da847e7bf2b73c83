package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/promoflow/promoflow/handlers/boost"
	"github.com/promoflow/promoflow/middleware"
)

// ErrRebuildRunning: a rebuild is under way in this or another process.
var ErrRebuildRunning = errors.New("a projection rebuild is already running")

// rebuildLockKey is the pg_advisory_lock key that lets one rebuild run at a time.
const rebuildLockKey = 7_301_914_222

// RebuildStatus is the state of the newest rebuild of this process.
type RebuildStatus struct {
	ID         string     `json:"id,omitempty"`
	State      string     `json:"state"` // idle, running, done, failed
	StartedAt  *time.Time `json:"startedAt,omitempty"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	Read       int64      `json:"read"`
	Skipped    int64      `json:"skipped"`
	Error      string     `json:"error,omitempty"`
}

// Rebuilder resets the PromotionBoost projection and replays the topics from
// their earliest offset up to the end seen at the start, through the consumer
// chain without its poison queue. The version guard makes the result
// deterministic whatever the order; normal consumption may run meanwhile.
type Rebuilder struct {
	DB      *sqlx.DB
	Brokers []string
	// Topics to replay: the purchase-changed topic and the DLQ replay topic.
	Topics []string
	// Chain is Catalog.Chain.
	Chain message.HandlerFunc
	Log   *slog.Logger

	mu     sync.Mutex
	status RebuildStatus
}

// Status returns the newest rebuild's state.
func (r *Rebuilder) Status() RebuildStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.status.State == "" {
		return RebuildStatus{State: "idle"}
	}
	return r.status
}

// Start begins a rebuild in the background, bound to ctx (the process).
func (r *Rebuilder) Start(ctx context.Context) (RebuildStatus, error) {
	r.mu.Lock()
	if r.status.State == "running" {
		r.mu.Unlock()
		return r.Status(), ErrRebuildRunning
	}
	now := time.Now().UTC()
	r.status = RebuildStatus{ID: uuid.NewString(), State: "running", StartedAt: &now}
	r.mu.Unlock()

	started := make(chan error, 2)
	go func() {
		err := r.run(ctx, started)
		r.finish(err)
	}()
	if err := <-started; err != nil {
		return r.Status(), err
	}
	return r.Status(), nil
}

// Run rebuilds synchronously.
func (r *Rebuilder) Run(ctx context.Context) (RebuildStatus, error) {
	now := time.Now().UTC()
	r.mu.Lock()
	r.status = RebuildStatus{ID: uuid.NewString(), State: "running", StartedAt: &now}
	r.mu.Unlock()
	err := r.run(ctx, make(chan error, 2))
	r.finish(err)
	return r.Status(), err
}

func (r *Rebuilder) finish(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now().UTC()
	r.status.FinishedAt = &now
	r.status.State = "done"
	if err != nil {
		r.status.State = "failed"
		r.status.Error = err.Error()
		r.Log.Error("projection rebuild failed", "id", r.status.ID, "error", err.Error())
		return
	}
	r.Log.Info("projection rebuild done", "id", r.status.ID, "read", r.status.Read, "skipped", r.status.Skipped)
}

// run reports on started once the reset committed (or failed).
func (r *Rebuilder) run(ctx context.Context, started chan<- error) (err error) {
	defer func() { started <- err }() // buffered for both sends; Start reads the first
	conn, err := r.DB.Connx(ctx)
	if err != nil {
		return fmt.Errorf("rebuild connection: %w", err)
	}
	defer conn.Close()
	var locked bool
	if err := conn.GetContext(ctx, &locked, `SELECT pg_try_advisory_lock($1)`, rebuildLockKey); err != nil {
		return fmt.Errorf("rebuild lock: %w", err)
	}
	if !locked {
		return ErrRebuildRunning
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, rebuildLockKey) //nolint:errcheck

	client, err := sarama.NewClient(r.Brokers, ClientConfig("promoflow-catalog-rebuild"))
	if err != nil {
		return fmt.Errorf("rebuild kafka client: %w", err)
	}
	defer client.Close()
	ends, err := endOffsets(client, r.Topics)
	if err != nil {
		return err
	}

	tx, err := r.DB.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin reset: %w", err)
	}
	if err := boost.ResetTx(ctx, tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit reset: %w", err)
	}
	r.Log.Info("projection reset, replaying", "id", r.Status().ID, "topics", r.Topics)
	started <- nil

	return r.replay(ctx, client, ends)
}

type partitionEnd struct {
	topic     string
	partition int32
	start     int64 // first offset still in the partition
	end       int64 // offset after the last record seen at the start
}

func endOffsets(client sarama.Client, topics []string) ([]partitionEnd, error) {
	var out []partitionEnd
	for _, topic := range topics {
		parts, err := client.Partitions(topic)
		if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("partitions of %s: %w", topic, err)
		}
		for _, p := range parts {
			start, err := client.GetOffset(topic, p, sarama.OffsetOldest)
			if err != nil {
				return nil, fmt.Errorf("start offset of %s/%d: %w", topic, p, err)
			}
			end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
			if err != nil {
				return nil, fmt.Errorf("end offset of %s/%d: %w", topic, p, err)
			}
			if start < end {
				out = append(out, partitionEnd{topic, p, start, end})
			}
		}
	}
	return out, nil
}

// replay reads every partition up to its end, one goroutine a partition, in
// order within each.
func (r *Rebuilder) replay(ctx context.Context, client sarama.Client, ends []partitionEnd) error {
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return fmt.Errorf("rebuild consumer: %w", err)
	}
	defer consumer.Close()
	var read, skipped atomic.Int64
	errc := make(chan error, len(ends))
	for _, pe := range ends {
		go func() { errc <- r.replayPartition(ctx, consumer, pe, &read, &skipped) }()
	}
	var errs []error
	for range ends {
		errs = append(errs, <-errc)
	}
	r.mu.Lock()
	r.status.Read, r.status.Skipped = read.Load(), skipped.Load()
	r.mu.Unlock()
	return errors.Join(errs...)
}

func (r *Rebuilder) replayPartition(ctx context.Context, consumer sarama.Consumer, pe partitionEnd, read, skipped *atomic.Int64) error {
	pc, err := consumer.ConsumePartition(pe.topic, pe.partition, pe.start)
	if err != nil {
		return fmt.Errorf("consume %s/%d: %w", pe.topic, pe.partition, err)
	}
	defer pc.Close()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case cm := <-pc.Messages():
			msg, err := kafka.DefaultMarshaler{}.Unmarshal(cm)
			if err != nil {
				return fmt.Errorf("unmarshal %s/%d@%d: %w", pe.topic, pe.partition, cm.Offset, err)
			}
			msg.SetContext(ctx)
			_, err = r.Chain(msg)
			var perm *middleware.Permanent
			switch {
			case errors.As(err, &perm):
				// Dead-lettered once already; a rebuild does not do it again.
				skipped.Add(1)
				r.Log.Warn("rebuild skipped a record", "topic", pe.topic, "partition", pe.partition,
					"offset", cm.Offset, "code", perm.Code, "reason", perm.Reason)
			case err != nil:
				return fmt.Errorf("apply %s/%d@%d: %w", pe.topic, pe.partition, cm.Offset, err)
			}
			read.Add(1)
			if cm.Offset >= pe.end-1 {
				return nil
			}
		}
	}
}
