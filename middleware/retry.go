package middleware

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/lib/pq"

	"github.com/promoflow/promoflow/handlers/event"
)

// Error codes of a Permanent error, written to the DLQ record's x-dlq-error-code.
const (
	// CodeContractViolation is a payload or contract violation (*event.ContractError).
	CodeContractViolation = "contract_violation"
	// CodeKeyMismatch is a record whose key is not its PurchaseId
	// (*event.KeyError): a contract violation that breaks the topic's compaction.
	CodeKeyMismatch = "key_mismatch"
	// CodeConflictExhausted is an optimistic-lock conflict that outlived its retries.
	CodeConflictExhausted = "conflict_exhausted"
	// CodeSQLRejected is an error PostgreSQL raised for the data or the
	// statement itself, SQLSTATE class 22 (data exception), 23 (integrity
	// constraint violation) or 42 (syntax error or access rule violation):
	// every re-run of the message raises it again.
	CodeSQLRejected = "sql_rejected"
)

// Retry kinds passed to RetryConfig.OnRetry and logged as "kind".
const (
	// RetryConflict is an immediate re-run after an optimistic-lock conflict.
	RetryConflict = "conflict"
	// RetryInfrastructure is a backed-off re-run after any other error.
	RetryInfrastructure = "infrastructure"
)

// Permanent is an error that retrying cannot fix; PoisonQueue dead-letters it.
type Permanent struct {
	// Code classifies the failure (CodeContractViolation, CodeConflictExhausted).
	Code string
	// Reason is a short human-readable cause, written to x-dlq-reason.
	Reason string
	// Err is the error the handler returned.
	Err error
}

// Error describes the permanent failure and its cause.
func (p *Permanent) Error() string {
	return fmt.Sprintf("permanent failure (%s): %v", p.Code, p.Err)
}

// Unwrap returns the handler's error, so errors.Is/As still see it.
func (p *Permanent) Unwrap() error { return p.Err }

// Retry defaults (seed: infrastructure backoff 1s → 60s; 3 conflict re-reads).
const (
	// RetryInitialIntervalDefault is the first infrastructure backoff.
	RetryInitialIntervalDefault = time.Second
	// RetryMaxIntervalDefault caps the infrastructure backoff.
	RetryMaxIntervalDefault = 60 * time.Second
	// RetryMultiplierDefault grows the infrastructure backoff per retry.
	RetryMultiplierDefault = 2.0
	// RetryConflictRetriesDefault is how many immediate re-runs a conflict gets.
	RetryConflictRetriesDefault = 3
)

// RetryConfig configures Retry.
type RetryConfig struct {
	// IsConflict reports whether an error is an optimistic-lock conflict (for
	// example errors.Is(err, boost.ErrConflict)). Required.
	IsConflict func(error) bool
	// ConflictRetries is how many immediate re-runs a conflict gets before it is
	// Permanent. Defaults to 3 (0 means the default; see NoConflictRetries).
	ConflictRetries int
	// NoConflictRetries makes a conflict Permanent after its first run, with
	// no re-run: zero retries, which ConflictRetries: 0 cannot say. Leave
	// ConflictRetries unset with it.
	NoConflictRetries bool
	// InitialInterval is the wait before the first infrastructure retry. Defaults to 1s.
	InitialInterval time.Duration
	// MaxInterval caps the infrastructure backoff. Defaults to 60s.
	MaxInterval time.Duration
	// Multiplier grows the wait after each infrastructure retry. Defaults to 2.
	Multiplier float64
	// Close, when closed, stops an infrastructure retry like the end of the
	// message context does. Optional.
	Close <-chan struct{}
	// Session, if set, returns the context of the consumer-group session that
	// delivered a message (Claims.Session), or nil. When that session ends
	// (a rebalance took the partition away), the attempt under way is
	// cancelled and the retry yields: the message is acked without its offset
	// being committed, so the partition's next owner reads it again.
	Session func(*message.Message) context.Context
	// Logger receives one WARN "retrying" record per retry. Defaults to slog.Default().
	Logger *slog.Logger
	// OnRetry, if set, is called once before every retry (for
	// catalog_promotion_retries_total); kind is RetryConflict or RetryInfrastructure.
	OnRetry func(msg *message.Message, kind string, attempt int, delay time.Duration, err error)
	// OnYield, if set, is called when a retry yields a revoked partition.
	OnYield func(msg *message.Message)
}

// Validate reports every missing or out-of-range setting.
func (c RetryConfig) Validate() error {
	c.setDefaults() // a copy: what the component will run with
	var errs []error
	if c.IsConflict == nil {
		errs = append(errs, errors.New("conflict classifier is required"))
	}
	if c.ConflictRetries < 0 {
		errs = append(errs, errors.New("conflict retries must be >= 0"))
	}
	if c.NoConflictRetries && c.ConflictRetries != 0 {
		errs = append(errs, errors.New("conflict retries are set together with no conflict retries"))
	}
	if c.InitialInterval <= 0 || c.MaxInterval < c.InitialInterval {
		errs = append(errs, errors.New("intervals must be positive with max >= initial"))
	}
	if c.Multiplier < 1 {
		errs = append(errs, errors.New("multiplier must be >= 1"))
	}
	return errors.Join(errs...)
}

func (c *RetryConfig) setDefaults() {
	if !c.NoConflictRetries {
		c.ConflictRetries = cmp.Or(c.ConflictRetries, RetryConflictRetriesDefault)
	}
	c.InitialInterval = cmp.Or(c.InitialInterval, RetryInitialIntervalDefault)
	c.MaxInterval = cmp.Or(c.MaxInterval, RetryMaxIntervalDefault)
	c.Multiplier = cmp.Or(c.Multiplier, RetryMultiplierDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

// Retry classifies the inner chain's errors by type and re-runs it:
//   - an error of a message whose context ended (shutdown) is returned as it
//     is, to nack the message, and one whose partition was revoked yields
//     (see RetryConfig.Session), whatever the error: neither is classified,
//     so nothing is dead-lettered for a message whose offset will not be
//     committed;
//   - a *Permanent passes through;
//   - an *event.ContractError becomes Permanent{Code: CodeContractViolation} at once,
//     and an *event.KeyError Permanent{Code: CodeKeyMismatch};
//   - a PostgreSQL error of SQLSTATE class 22, 23 or 42 (the data or the
//     statement, not the server) becomes Permanent{Code: CodeSQLRejected} at
//     once: a re-run raises it again, and would stall the partition for ever
//     (a missing privilege, table or column is the environment: it retries);
//   - a conflict (IsConflict) is re-run immediately up to ConflictRetries times,
//     each in a fresh transaction of the unit of work inside, then becomes
//     Permanent{Code: CodeConflictExhausted};
//   - anything else is infrastructure: it is re-run with exponential backoff
//     without end and never becomes Permanent. The message stays in flight,
//     which pauses its partition. When the message context ends or Close is
//     closed, the last error is returned so the message is nacked, not dead-lettered.
//
// When the partition is revoked (see RetryConfig.Session), no retry outlives
// it: Retry yields, and data correctness rests, as ever, on dedup and the
// version guard when the next owner applies the message.
func Retry(cfg RetryConfig) (message.HandlerMiddleware, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("retry config: %w", err)
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			sess := cfg.session(msg)
			conflicts, infra := 0, 0
			delay := cfg.InitialInterval
			for {
				out, err := attempt(h, msg, sess)
				if err == nil {
					return out, nil
				}
				// Before any classification: the offset of a message whose
				// context or session ended is not committed, so its next
				// delivery decides, and a dead letter written now would be
				// written again then.
				ctx := msg.Context()
				if ctx.Err() != nil {
					// Shutting down: nack, never DLQ.
					return nil, err
				}
				if sess.Err() != nil {
					return cfg.yield(msg, err)
				}
				var perm *Permanent
				if errors.As(err, &perm) {
					return nil, err
				}
				var contract *event.ContractError
				if errors.As(err, &contract) {
					return nil, &Permanent{Code: CodeContractViolation, Reason: contract.Error(), Err: err}
				}
				var key *event.KeyError
				if errors.As(err, &key) {
					return nil, &Permanent{Code: CodeKeyMismatch, Reason: key.Error(), Err: err}
				}
				if rejected, ok := rejectedSQL(err); ok {
					return nil, &Permanent{Code: CodeSQLRejected, Reason: rejected, Err: err}
				}
				if cfg.IsConflict(err) {
					if conflicts >= cfg.ConflictRetries {
						return nil, &Permanent{
							Code:   CodeConflictExhausted,
							Reason: fmt.Sprintf("optimistic-lock conflict after %d retries: %v", conflicts, err),
							Err:    err,
						}
					}
					conflicts++
					cfg.retrying(msg, RetryConflict, conflicts, 0, err)
					continue
				}

				infra++
				cfg.retrying(msg, RetryInfrastructure, infra, delay, err)
				timer := time.NewTimer(delay)
				select {
				case <-timer.C:
				case <-ctx.Done():
					timer.Stop()
					return nil, err
				case <-cfg.Close:
					timer.Stop()
					return nil, err
				case <-sess.Done():
					timer.Stop()
					return cfg.yield(msg, err)
				}
				delay = min(time.Duration(float64(delay)*cfg.Multiplier), cfg.MaxInterval)
			}
		}
	}, nil
}

// rejectedSQL describes the PostgreSQL error in err's chain that a re-run
// would raise again: SQLSTATE class 22 (data exception), 23 (integrity
// constraint violation) or 42 (syntax error or access rule violation). A
// connection error, a server going away or a timeout (classes 08, 53, 57, ...)
// is not one: it clears by itself. Nor is a missing privilege or object
// (42501, 42P01, 42703, 42704, 42883): that is the database the process was
// given (a role without a grant, a migration not applied yet), the same for
// every message, cleared by an operator without a change of code; dead-
// lettering it would send every event to the DLQ, so it retries, pausing the
// partition, and the lag alert pages.
func rejectedSQL(err error) (string, bool) {
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) {
		return "", false
	}
	switch pqErr.Code {
	case "42501", "42P01", "42703", "42704", "42883":
		return "", false
	}
	switch pqErr.Code.Class() {
	case "22", "23", "42":
		return fmt.Sprintf("SQLSTATE %s (%s): %s", pqErr.Code, pqErr.Code.Name(), pqErr.Message), true
	}
	return "", false
}

// attempt runs the chain once, on a context that also ends with the session.
func attempt(h message.HandlerFunc, msg *message.Message, sess context.Context) ([]*message.Message, error) {
	parent := msg.Context()
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	defer context.AfterFunc(sess, cancel)()
	msg.SetContext(ctx)
	defer msg.SetContext(parent)
	return h(msg)
}

// session is the message's consumer-group session, or a context that never ends.
func (c RetryConfig) session(msg *message.Message) context.Context {
	if c.Session != nil {
		if s := c.Session(msg); s != nil {
			return s
		}
	}
	return context.Background()
}

// yield gives the message up to the partition's next owner: nil makes the
// router ack it, and the subscriber commits no offset for a session that ended.
func (c RetryConfig) yield(msg *message.Message, err error) ([]*message.Message, error) {
	c.Logger.WarnContext(msg.Context(), "partition revoked during retry; left to its next owner",
		"MessageId", msg.UUID,
		"PurchaseId", msg.Metadata.Get(event.HeaderAggregateID),
		"error", err.Error())
	if c.OnYield != nil {
		c.OnYield(msg)
	}
	return nil, nil
}

func (c RetryConfig) retrying(msg *message.Message, kind string, attempt int, delay time.Duration, err error) {
	c.Logger.WarnContext(msg.Context(), "retrying",
		"MessageId", msg.UUID,
		"PurchaseId", msg.Metadata.Get(event.HeaderAggregateID),
		"kind", kind,
		"attempt", attempt,
		"delay", delay,
		"error", err.Error())
	if c.OnRetry != nil {
		c.OnRetry(msg, kind, attempt, delay, err)
	}
}
