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
//     partition flows on. A dead letter too large for the DLQ topic goes by
//     reference (poison_reference.go): no value, where the record is and its
//     hash, so that no record holds its key for its size.
//  4. Retry (retry.go): a message whose partition was revoked (rebalance.go's
//     Claims) yields whatever its error, before any classification, so
//     nothing is dead-lettered for an offset that will not be committed.
//     Otherwise it acts on the error's class (below): the record's faults
//     become Permanent at once, transient and systemic errors retry with
//     backoff without end (pausing the partition), conflicts first get 3
//     immediate re-runs. It sits outside the unit of work, so every attempt
//     runs in a fresh transaction.
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
//
// # Failure classes
//
// Every error a record meets has one class, and Classify (classes.go) is the
// one place that decides it, by type and SQLSTATE, never by message; its
// table-driven test, TestClassify_EveryFailureHasOneClass, pins this table.
// A SQLSTATE named alone wins over its class.
//
//	class      SQLSTATE or error                          what Retry does
//	---------  -----------------------------------------  ------------------------------------
//	record     *event.ContractError (contract_violation)  dead-letter now, no re-run
//	           *event.KeyError (key_mismatch)
//	           22 data exception (invalid bytes, values)  dead-letter now as sql_rejected:
//	           23 integrity constraint violation          every re-run raises it again
//	           42 syntax or access rule, but see below
//	           54 program limit (54000 index row too
//	              large, 54001 statement too complex)
//	transient  40001 serialization failure               retry with backoff 1s → 60s, the
//	           40P01 deadlock                             partition paused; never dead-lettered
//	           55P03 lock not available (lock_timeout)    (40001, 40P01, 55P03 first get the
//	           57014 query canceled (statement_timeout)   conflict's 3 immediate re-reads)
//	           53200 out of memory, the lock table too
//	           context.DeadlineExceeded (the unit of
//	              work's own timeout)
//	systemic   08 connection exception                    retry with backoff without end, the
//	           28 authorization, 3D no such database      partition paused; never
//	           53100 disk full, 53300 too many            dead-lettered: the lag alert
//	              connections, other 53 resources         (CatalogPromotionLagHigh) pages
//	           57P01-57P05 shutdown, cannot connect now
//	           58 system error (I/O)
//	           25006 read-only transaction (a standby)
//	           42501 no privilege, 42P01 no table, 42703
//	              no column, 42704 no object, 42883 no
//	              function (a grant or a migration missing)
//	           a refused, broken or timed-out connection
//	unnamed    anything else (XX000, a Go error no one    retry with backoff; dead-letter as
//	           named)                                     stuck_record once it failed one record
//	                                                      10 times over 5 minutes
//	                                                      (RetryConfig.UnnamedAttempts,
//	                                                      UnnamedAfter) while another record of
//	                                                      the process succeeded since
//
// A conflict that names no SQLSTATE (the seed's optimistic-lock conflict, a
// card that moved during a repair) gets its 3 immediate re-reads, then the
// DLQ as conflict_exhausted, from which a replay is safe. A valid event is
// never dead-lettered for a resource of the server: a full lock table, a
// full disk or a timeout retries until the resource is back, while the lag
// alert fires. A wide event does not fill the lock table by itself: its
// advisory locks are striped (handlers/boost/lock.go), and
// router.TestCatalog_WideEventsAtOnceAllApply applies three events of
// 12,000 targets at once on a server of default settings.
package middleware
