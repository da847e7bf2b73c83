// Package middleware holds the catalog consumer's cross-cutting policies as
// Watermill handler middlewares, one policy per file. router/catalog.go
// assembles the chain; outermost first, and why each step sits where it does:
//
//  1. Receive span "catalog.promotion.receive" (tracing.go): outermost, so
//     the span covers everything the record costs, dead-lettering included;
//     it continues the trace context of the record's headers.
//  2. Lag (lag.go): counts a record from arrival to ack, so the lag grows while
//     a retry holds the record.
//  3. PoisonQueue (poison.go): sees only what Retry gave up on as Permanent,
//     writes it to the DLQ with its key and headers, and acks it, so the
//     partition flows on.
//  4. Retry (retry.go): a message whose partition was revoked (rebalance.go's
//     Claims) yields whatever its error, before any classification, so
//     nothing is dead-lettered for an offset that will not be committed.
//     Otherwise it classifies errors by type: infrastructure errors retry
//     without end with backoff (pausing the partition); conflicts get 3
//     immediate re-runs; contract violations become Permanent at once. It
//     sits outside the unit of work, so every attempt runs in a fresh
//     transaction.
//  5. ContractVersion (contractversion.go): warns and counts a mismatch, and
//     proceeds (the seed's warn-and-proceed); the payload's own validation decides.
//  6. Span "catalog.promotion.process": one per attempt, the handler's work.
//  7. The handler parses the event and waits on GroupCommit (groupcommit.go),
//     the unit of work with dedup: the events that wait at the same time (up
//     to the subscriber's lanes of each partition) share one transaction; their dedup marks
//     (dedup.go: digests of the MessageId and the payload) are stored in it, so
//     each mark commits or rolls back with its state change, and a duplicate is an ack no-op. The handler returns only
//     after the commit, so replica, card boosts and dedup mark commit
//     together, then the offset is acked. A failed transaction of several
//     events re-runs each alone, so every attempt of one event is its own.
//     The transaction's span "catalog.promotion.store" is the seed's span of
//     a call to the store: it continues the process span of a transaction
//     of one event and links to each process span of a shared one.
//
// Beside the chain, Offsets (offsets.go): the unit of work's transaction also
// stores each partition's next offset, so the consumer's position lives with
// the projection, and each consumer group session seeks every claimed
// partition there: a failover or a restore of the catalog database replays
// what the database lost, whatever Kafka's committed offset says.
//
// A projection rebuild replays the topic through steps 4 to 7: a record that
// fails for good was dead-lettered once already.
package middleware
