// Package redisbackend implements limiter.Limiter on Redis (single node,
// Sentinel or Cluster) with go-redis v9.
//
// One Lua script decides a whole batch (limiter.Limiter.Check): it evaluates
// every request in order against its counter, lets a request see the
// tentative consumption of earlier requests on the same counter, and writes
// only when no non-shadow request was denied. Each algorithm of DESIGN.md §5
// has its own Lua file under lua/ (the twin of the Go code in pkg/algorithm);
// they are embedded with go:embed and concatenated with a driver into the
// check and refund scripts (see scripts.go and the header of every file). The
// check runs as a Redis Function (FCALL; the library is loaded with FUNCTION
// LOAD at the first Ping or check, and again whenever the server lost it) so
// that Redis does not redefine the helpers on every call; on servers without
// Functions, or with Options.DisableFunctions, it runs as a script with
// EVALSHA, falling back to EVAL when Redis does not know it yet (NOSCRIPT).
//
// Time comes from Redis TIME inside the script, so instances whose clocks
// disagree still count in the same windows; Options.Now injects a clock for
// tests. Every key gets its expiry in the script that writes it.
//
// Single node and Sentinel: at most one script call (one round trip) per
// Check. Concurrent Checks are coalesced (Options.Senders; see coalesce.go):
// a call carries every Check that waited while the calls before it were in
// flight, and Redis decides them one after the other, each atomically, as if
// each had been a call of its own. A call reads every counter of a Check with
// one MGET and writes each admitted counter once.
//
// Cluster: the batch is split by hash slot, one script call per slot.
// Concurrent Checks are coalesced too: their calls of one slot share a
// script call, and all of them go out in one pipeline, which go-redis splits
// by node (one network write and read per node); with coalescing off, a
// Check's calls are sent in parallel. When one
// slot vetoes the batch while another slot admitted and consumed, the consumed hits are given back by a second script
// (refund.lua). Between the two calls other requests may see the extra count
// and be denied although they would have been admitted; the refund never
// admits more than the limit, so the transient error only ever under-admits.
// While a hash slot migrates, a call whose keys are split between the two
// masters is refused with TRYAGAIN before it runs, and is sent again after
// a short wait, a few times within its deadline (see cluster.go).
//
// See keys.go for the key format. Failures to reach Redis or to decide
// (network errors, timeouts, the context's deadline, CLUSTERDOWN, LOADING,
// READONLY, script errors) are returned wrapped so that
// errors.Is(err, limiter.ErrUnavailable) holds.
//
// A Backend is safe for concurrent use.
package redisbackend
