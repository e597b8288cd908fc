// Package algorithm is the pure arithmetic of the rate-limit algorithms of
// DESIGN.md §5, with the clock passed in: every function takes now as
// integer milliseconds since the Unix epoch and returns a Decision and the
// state to store. Nothing here reads a clock, holds a lock or keeps a map;
// the in-memory backend stores the states, and the Redis Lua scripts are
// checked against these functions by the conformance suite
// (pkg/limiter/limitertest).
//
// Each algorithm has a parameter type (SlidingWindow, FixedWindow,
// TokenBucket, SlidingLog) with a Decide method, and a state type whose
// zero value means "no counter yet". Decide and the package-level Decide
// dispatcher are safe for concurrent use: they only read their arguments.
// DecideOwned, for a store that keeps one state per counter under a lock,
// decides alike but may reuse the memory of states decided before (a
// sliding log appends in place instead of copying itself), and Reserve
// makes that room on the state the store keeps.
//
// Common rules (COMMON.md, "Clock and numbers"):
//   - hits == 0 checks without consuming: Allowed and RetryAfter are decided
//     as for one hit, nothing is consumed, Remaining is computed on the
//     unchanged state.
//   - hits greater than the capacity (the limit, or a token bucket's burst)
//     can never be admitted: Allowed is false, nothing is consumed and
//     RetryAfter is the window, as a hint.
//   - RetryAfter of a denial is exact: with no other traffic the same hits
//     are admitted at now+RetryAfter and denied at now+RetryAfter−1ms.
//
// The token bucket is computed in exact integer arithmetic (see
// TokenBucket), not in float64 as a first draft of the design had it: in
// float64 an empty bucket refused a full burst in about a quarter of random
// cases because now+burst·T rounds at the magnitude of a Unix-millisecond
// clock.
package algorithm
