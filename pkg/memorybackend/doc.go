// Package memorybackend is a limiter.Limiter that keeps its counters in
// process: the embedded default when no Redis is configured, and the
// fail-soft layer's fallback.
//
// Counters live in a sharded map (one mutex per shard); a batch locks the
// shards of its counters in ascending order, so it is atomic and free of
// deadlocks. Decisions are those of pkg/algorithm with the batch semantics
// of limiter.Limiter (checked by pkg/limiter/limitertest). Counters expire
// when they become equivalent to an empty one; expired counters are ignored
// on read and deleted by a sweeper goroutine, which Close stops.
package memorybackend
