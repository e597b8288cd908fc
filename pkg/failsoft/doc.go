// Package failsoft provides a limiter.Limiter that keeps answering when the
// shared store does not.
//
// A *Limiter wraps a primary limiter (Redis, through pkg/redisbackend) and a
// fallback limiter (in process, through pkg/memorybackend); it imports
// neither. Every Check goes to the primary under a deadline shortened by
// Options.DeadlineMargin, so that a slow store still leaves time to answer:
// given to a primary that is a DeadlineChecker as a value (CheckBy), to any
// other as a derived context.
// When the primary reports limiter.ErrUnavailable (or the shortened deadline
// expires while the caller's context is still alive), or while the circuit
// breaker is open, each Request is decided by its FailureMode:
//
//   - fallback: the fallback limiter decides, at this instance's share of the
//     limit: Requests (and a token bucket's Burst) divided by the number N of
//     live instances, rounded down, at least 1 (see Share). Result.Source is
//     limiter.SourceFallback, and Remaining is what is left of this
//     instance's share.
//   - allow: admitted, Remaining is the limit's capacity, Result.Source is
//     limiter.SourceFailAllow.
//   - deny: denied, RetryAfter is Options.DenyRetryAfter, Result.Source is
//     limiter.SourceFailDeny.
//
// The batch stays all-or-nothing: a non-shadow deny-mode Request denies the
// whole batch, and then the fallback Requests consume nothing; the fallback
// Requests among themselves are decided in one fallback Check. A store outage
// never becomes an error: Check returns an error only for a malformed batch
// (limiter.ErrInvalid), when the caller's own context ended, or when the
// primary fails in a way that is not an outage.
//
// N is learned through heartbeats (Options.Heartbeat, driven by Run) and kept
// at its last known value while the store is down; Options.Instances
// overrides it.
//
// A circuit breaker (github.com/sony/gobreaker/v2) stops sending requests to
// a store that keeps failing (BreakerOptions) and lets a few probes through
// after BreakerOptions.OpenTimeout; when they succeed it closes and decisions
// return to the store. An outage is the time the breaker is not closed: it is
// logged once when it starts ("store unavailable: deciding by failure_mode",
// with the error that tripped the breaker) and once when it ends ("store
// recovered", with its length), and reported through Observer.FallbackActive.
// A single failed call while the breaker is closed is answered by failure
// mode and counted (Observer.StoreError) but not logged. One breaker guards
// the whole store: in Cluster mode a lost master can trip it for every key
// for an OpenTimeout at a time.
package failsoft
