package middleware

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
)

// CodeParked is a record an operator parked (`promoflow dlq park`): the
// consumer dead-letters it at its next failure, with the operator's reason.
const CodeParked = "parked"

// ParkRequest asks the consumer that owns Topic's Partition to dead-letter
// the record at Offset the next time it fails, and go on.
type ParkRequest struct {
	Topic     string `db:"topic"`
	Partition int32  `db:"partition"`
	Offset    int64  `db:"offset"`
	Reason    string `db:"reason"`
}

// Validate names the field a request lacks.
func (r ParkRequest) Validate() error {
	var errs []error
	if r.Topic == "" {
		errs = append(errs, errors.New("the topic is required"))
	}
	if r.Partition < 0 {
		errs = append(errs, fmt.Errorf("partition %d: want 0 or more", r.Partition))
	}
	if r.Offset < 0 {
		errs = append(errs, fmt.Errorf("offset %d: want 0 or more", r.Offset))
	}
	if strings.TrimSpace(r.Reason) == "" {
		errs = append(errs, errors.New("a reason is required: it goes to the dead letter's x-dlq-reason"))
	}
	return errors.Join(errs...)
}

// RequestPark writes r to catalog.dlq_park_requests; a request for the same
// record replaces the reason of one not yet done.
func RequestPark(ctx context.Context, db sqlx.ExecerContext, r ParkRequest) error {
	if err := r.Validate(); err != nil {
		return err
	}
	res, err := db.ExecContext(ctx, `INSERT INTO catalog.dlq_park_requests (topic, partition, "offset", reason)
		VALUES ($1, $2, $3, $4)
		ON CONFLICT (topic, partition, "offset") DO UPDATE SET reason = EXCLUDED.reason, requested_at = now()
		WHERE dlq_park_requests.done_at IS NULL`, r.Topic, r.Partition, r.Offset, r.Reason)
	if err != nil {
		return fmt.Errorf("write the park request: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("partition %d offset %d of %s was parked already", r.Partition, r.Offset, r.Topic)
	}
	return nil
}

// Parks answers, for a record that failed, whether an operator parked it.
type Parks struct {
	DB  *sqlx.DB
	Log *slog.Logger
}

// parkTimeout bounds the read of a park request: the record failed anyway,
// and a failed read leaves it to the next retry.
const parkTimeout = 5 * time.Second

// Middleware goes inside Retry: when the handler fails for a record that
// has a park request, it returns a Permanent error (CodeParked) with the
// operator's reason instead, which PoisonQueue dead-letters. Only failures
// read the table, so the consumer's hot path is unchanged.
func (p *Parks) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil {
			return out, nil
		}
		var perm *Permanent
		if errors.As(err, &perm) {
			return out, err
		}
		pos, ok := PositionOf(msg)
		if !ok {
			return out, err
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), parkTimeout)
		defer cancel()
		var reason string
		switch qerr := p.DB.GetContext(ctx, &reason, `SELECT reason FROM catalog.dlq_park_requests
			WHERE topic = $1 AND partition = $2 AND "offset" = $3 AND done_at IS NULL`, pos.Topic, pos.Partition, pos.Offset); {
		case errors.Is(qerr, sql.ErrNoRows):
			return out, err
		case qerr != nil:
			p.Log.Warn("park-request-unreadable", "partition", pos.Partition, "offset", pos.Offset, "error", qerr.Error())
			return out, err
		}
		p.Log.Warn("record-parked", "topic", pos.Topic, "partition", pos.Partition, "offset", pos.Offset,
			"reason", reason, "error", err.Error())
		return nil, &Permanent{Code: CodeParked, Reason: "parked by an operator: " + reason, Err: err}
	}
}

// Done marks msg's park request done, once its dead letter is written; a
// failure is logged (the request stays, and matches no record again).
func (p *Parks) Done(msg *message.Message) {
	pos, ok := PositionOf(msg)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), parkTimeout)
	defer cancel()
	if _, err := p.DB.ExecContext(ctx, `UPDATE catalog.dlq_park_requests SET done_at = now()
		WHERE topic = $1 AND partition = $2 AND "offset" = $3 AND done_at IS NULL`, pos.Topic, pos.Partition, pos.Offset); err != nil {
		p.Log.Warn("park-request-not-marked-done", "partition", pos.Partition, "offset", pos.Offset, "error", err.Error())
	}
}
