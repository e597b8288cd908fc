// Package limiter is the one contract shared by the service and every
// counting backend: a batched, all-or-nothing Check over the limits of one
// Envoy request, the value types it speaks, and the sentinel errors a backend
// reports.
//
// The package depends on the standard library only. Backends (the in-memory
// one, Redis, the fail-soft wrapper) implement Limiter; pkg/rls consumes it.
// The semantics of each Algorithm are defined in pkg/algorithm and in
// DESIGN.md §5; the conformance suite in limitertest checks that a backend
// agrees with them.
package limiter
