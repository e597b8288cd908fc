// Package limitertest is the conformance suite every limiter.Limiter backend
// runs: the same scripted inputs must give the decisions of the reference
// arithmetic in pkg/algorithm, with the batch semantics below.
//
// A backend's tests call Run with a Factory that builds a fresh, empty
// Limiter on a given clock, and Hammer with several Limiter instances that
// share one store and a Clock the test controls:
//
//	func TestConformance(t *testing.T) {
//		limitertest.Run(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
//			return newBackend(t, now) // fresh and empty; decides at now()
//		})
//	}
//
// Batch semantics checked (COMMON.md, "Batches"):
//   - Requests are evaluated in order; a Request sees the tentative
//     consumption of earlier Requests of the batch on the same counter
//     (storage identity = Key, Algorithm, Window).
//   - If any non-shadow Request is denied, nothing is consumed. Each Result
//     keeps the Allowed and RetryAfter of its in-order evaluation, and its
//     Remaining and ResetAfter are those of the stored state, without any
//     consumption of the batch (what algorithm.Decide gives for hits 0 on
//     the stored state).
//   - Otherwise every Request whose own predicate admitted consumes, and its
//     Remaining and ResetAfter are those right after its own consumption
//     (so two identical Requests in one batch report L−1 and L−2). A denied
//     shadow Request consumes nothing.
//   - Source is limiter.SourceStore.
//   - A malformed batch (empty Key, invalid Limit, len(results) !=
//     len(reqs)) returns an error wrapping limiter.ErrInvalid and consumes
//     nothing; a Check with an already cancelled context returns an error
//     wrapping context.Canceled and consumes nothing.
//
// The token bucket is decided in exact integer arithmetic; see
// algorithm.TokenBucket for the formulas a Lua script must reproduce.
package limitertest
