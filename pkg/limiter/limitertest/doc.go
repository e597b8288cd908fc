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
// Numbers a Redis script must reproduce (see pkg/algorithm for each
// algorithm's doc comment):
//   - sliding_window: pw = ceil(prev*(W−elapsed)/W) in doubles, as in
//     COMMON.md; RetryAfter is the smallest d ≥ 1 at which the predicate
//     admits (with the counts unchanged; it may fall in the next bucket).
//   - token_bucket: exact integer GCRA in ticks of 1/L ms, not the float64
//     tat of COMMON.md (which refuses a full burst on an empty bucket in
//     about a quarter of cases at a Unix-ms clock). Store At (ms), Debt
//     (ticks after At) and Per (the L the debt was counted in; rescale with
//     ceil(Debt·L/Per) when L changed). rel = max(0, Debt − (now−At)·L);
//     admit iff rel + c·W ≤ B·W; Remaining = floor((B·W − rel)/W);
//     ResetAfter = ceil(rel/L) ms; RetryAfter = ceil((rel + c·W − B·W)/L) ms;
//     expire the key after ceil(rel/L) ms.
//   - sliding_log: entries with time ≤ now−W are gone; RetryAfter = t_k +
//     W − now for the (n+c−L)-th oldest hit.
//   - hits greater than the capacity: denied, RetryAfter = W, nothing
//     consumed, Remaining/ResetAfter as for hits 0.
//
// Hammer checks concurrency: several instances on one store, many
// goroutines, one instant per round, admitted count compared exactly with
// the model.
package limitertest
