// Package middleware holds the catalog consumer's cross-cutting policies as
// Watermill handler middlewares, one policy per file. The chain, outermost
// first, is PoisonQueue → Retry → ContractVersion → UnitOfWork → Dedup → handler:
// the poison queue sees only the errors retry gave up on as Permanent, and every
// retry re-runs the unit of work, so each attempt reads in a fresh transaction.
package middleware
