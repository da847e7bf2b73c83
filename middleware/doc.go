// Package middleware holds the catalog consumer's cross-cutting policies as
// Watermill handler middlewares, one policy per file. router/catalog.go
// assembles the chain; outermost first, and why each step sits where it does:
//
//  1. Span "catalog.promotion.receive" (tracing.go): outermost, so the span
//     covers everything the record costs, dead-lettering included.
//  2. Lag (lag.go): counts a record from arrival to ack, so the lag grows while
//     a retry holds the record.
//  3. PoisonQueue (poison.go): sees only what Retry gave up on as Permanent,
//     writes it to the DLQ with its key and headers, and acks it, so the
//     partition flows on.
//  4. Retry (retry.go): classifies errors by type; infrastructure errors retry
//     without end with backoff (pausing the partition) but yield a revoked
//     partition (rebalance.go's Claims); conflicts get 3 immediate re-runs;
//     contract violations become Permanent at once. It sits outside the unit
//     of work, so every attempt runs in a fresh transaction.
//  5. ContractVersion (contractversion.go): warns and counts a mismatch, and
//     proceeds (the seed's warn-and-proceed); the payload's own validation decides.
//  6. Span "catalog.promotion.process": one per attempt.
//  7. UnitOfWork (unitofwork.go): one transaction per attempt; it commits only
//     when the handler returns nil, so replica, card boosts and dedup mark
//     commit together, then the offset is acked.
//  8. Dedup (dedup.go): inside the transaction, so the dedup key commits or
//     rolls back with the state change; a duplicate is an ack no-op.
//  9. Span "catalog.promotion.store": the handler's work in the transaction.
//
// A projection rebuild replays the topic through steps 4 to 9: a record that
// fails for good was dead-lettered once already.
package middleware
