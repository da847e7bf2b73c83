package middleware

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

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
	// constraint violation), 42 (syntax error or access rule violation) or
	// 54 (program limit exceeded): every re-run of the message raises it again.
	CodeSQLRejected = "sql_rejected"
	// CodeStuckRecord is an error the classes do not name that kept failing
	// one record past RetryConfig's UnnamedAttempts and UnnamedAfter while
	// other records of the process succeeded.
	CodeStuckRecord = "stuck_record"
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
	// RetryUnnamedAttemptsDefault is how many failures of an unnamed error
	// a record gets before it can be dead-lettered.
	RetryUnnamedAttemptsDefault = 10
	// RetryUnnamedAfterDefault is how long an unnamed error must keep
	// failing a record before it can be dead-lettered: with the default
	// backoff, about the ten attempts of RetryUnnamedAttemptsDefault.
	RetryUnnamedAfterDefault = 5 * time.Minute
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
	// UnnamedAttempts and UnnamedAfter bound an error the classes do not
	// name: once it has failed one record that many times over that long,
	// while another record of the process succeeded since its first
	// failure, the record is dead-lettered (CodeStuckRecord). Default 10
	// attempts and 5m; both must be passed.
	UnnamedAttempts int
	// UnnamedAfter: see UnnamedAttempts.
	UnnamedAfter time.Duration
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
	if c.UnnamedAttempts < 1 || c.UnnamedAfter < 0 {
		errs = append(errs, errors.New("unnamed attempts must be >= 1 and unnamed after >= 0"))
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
	c.UnnamedAttempts = cmp.Or(c.UnnamedAttempts, RetryUnnamedAttemptsDefault)
	c.UnnamedAfter = cmp.Or(c.UnnamedAfter, RetryUnnamedAfterDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

// Retry re-runs the inner chain by the class of its error (Classify; the
// table is in the package documentation):
//   - an error of a message whose context ended (shutdown) is returned as it
//     is, to nack the message, and one whose partition was revoked yields
//     (see RetryConfig.Session), whatever the error: neither is classified,
//     so nothing is dead-lettered for a message whose offset will not be
//     committed;
//   - a *Permanent passes through;
//   - ClassRecord becomes Permanent at once, with the class's code;
//   - a conflict (IsConflict) is re-run immediately up to ConflictRetries
//     times, each in a fresh transaction of the unit of work inside; then a
//     conflict of a named class (a deadlock, a lock timeout) backs off like
//     its class, and any other becomes Permanent{Code: CodeConflictExhausted};
//   - ClassTransient and ClassSystemic are re-run with exponential backoff
//     without end and never become Permanent. The message stays in flight,
//     which pauses its partition. When the message context ends or Close is
//     closed, the last error is returned so the message is nacked, not
//     dead-lettered;
//   - ClassUnnamed backs off the same way until UnnamedAttempts and
//     UnnamedAfter are both passed while another record succeeded since its
//     first failure; then it is Permanent{Code: CodeStuckRecord}. An error
//     that fails every record (nothing succeeds) is never dead-lettered.
//
// When the partition is revoked (see RetryConfig.Session), no retry outlives
// it: Retry yields, and data correctness rests, as ever, on dedup and the
// version guard when the next owner applies the message.
func Retry(cfg RetryConfig) (message.HandlerMiddleware, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("retry config: %w", err)
	}
	// When a record of the process last succeeded: an unnamed error that
	// fails one record while others pass is that record's.
	var lastSuccess atomic.Int64
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			sess := cfg.session(msg)
			conflicts, infra, unnamed := 0, 0, 0
			var first time.Time // of the first unnamed failure
			delay := cfg.InitialInterval
			for {
				out, err := attempt(h, msg, sess)
				if err == nil {
					lastSuccess.Store(time.Now().UnixNano())
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
				f := Classify(err)
				if f.Class == ClassRecord {
					return nil, &Permanent{Code: f.Code, Reason: f.Reason, Err: err}
				}
				if cfg.IsConflict(err) {
					if conflicts < cfg.ConflictRetries {
						conflicts++
						cfg.retrying(msg, RetryConflict, f.Class, conflicts, 0, err)
						continue
					}
					// A deadlock or a lock timeout outlives its re-reads
					// under load, and is no fault of the record: it backs
					// off. A conflict the table does not name is the
					// seed's optimistic-lock conflict.
					if f.Class == ClassUnnamed {
						return nil, &Permanent{
							Code:   CodeConflictExhausted,
							Reason: fmt.Sprintf("optimistic-lock conflict after %d retries: %v", conflicts, err),
							Err:    err,
						}
					}
				}
				if f.Class == ClassUnnamed {
					if first.IsZero() {
						first = time.Now()
					}
					unnamed++
					if cfg.stuck(unnamed, first, lastSuccess.Load()) {
						return nil, &Permanent{
							Code: CodeStuckRecord,
							Reason: fmt.Sprintf("failed %d times over %s while other records succeeded: %v",
								unnamed, time.Since(first).Round(time.Second), err),
							Err: err,
						}
					}
				}

				infra++
				cfg.retrying(msg, RetryInfrastructure, f.Class, infra, delay, err)
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

// stuck reports whether an unnamed error, failed times since first, is its
// record's: past both bounds, and another record succeeded since first.
func (c RetryConfig) stuck(failed int, first time.Time, lastSuccess int64) bool {
	return failed >= c.UnnamedAttempts && time.Since(first) >= c.UnnamedAfter && lastSuccess > first.UnixNano()
}

func (c RetryConfig) retrying(msg *message.Message, kind string, class Class, attempt int, delay time.Duration, err error) {
	c.Logger.WarnContext(msg.Context(), "retrying",
		"MessageId", msg.UUID,
		"PurchaseId", msg.Metadata.Get(event.HeaderAggregateID),
		"kind", kind,
		"class", class.String(),
		"attempt", attempt,
		"delay", delay,
		"error", err.Error())
	if c.OnRetry != nil {
		c.OnRetry(msg, kind, attempt, delay, err)
	}
}
