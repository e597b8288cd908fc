// Package denycache provides a limiter.Limiter decorator that answers
// repeated denials of hot keys locally: a bounded cache of counters known to
// be denied until an exact instant, which never changes a decision.
//
// A key over its limit is typically hammered: every request of an abusive
// client reaches the store only to be told "denied, retry in 740 ms" again.
// The store's denial carries the exact instant at which the counter would
// admit again if nothing else arrived (limiter.Result.RetryAfter), and until
// that instant every further request can only be denied too, because the
// four algorithms are monotone: with no other traffic a denied counter stays
// denied until RetryAfter has passed, and other traffic only consumes, which
// makes the instant later, never earlier. A Cache remembers that instant and
// answers a batch without the store when every request of the batch is such
// a counter.
//
// # What is cached
//
// After the inner Check, a Result is remembered when it is a denial decided
// by the store (Source == limiter.SourceStore: never a fallback or
// failure-mode decision) of a request deciding one hit (Hits 0 or 1), and no
// earlier request of the same batch used the same counter (such a request's
// tentative consumption may be what denied it, and the batch as a whole
// consumed nothing). The entry is kept per counter (storage identity: Key,
// Algorithm, Window) and records the limit's Requests and Burst: a request
// with other numbers (a configuration change) is not answered by it. A batch
// the inner limiter admitted deletes the entries of the counters it consumed
// on, so an entry's figures do not go stale through this instance's own
// traffic (unless that traffic raced with the denial in flight).
//
// # Why the cached instant is never late
//
// The entry is valid until at + RetryAfter − 1 ms, where at is the local
// clock read before the inner call was sent. The store decided at an instant
// t ≥ at, reading its clock to the millisecond (Redis TIME → ms, floored), so
// it admits again only once its millisecond clock reaches floor(t) +
// RetryAfter: more than RetryAfter − 1 ms after t, so at a local time later
// than at + RetryAfter − 1 ms. A local answer at local time now ≤ at +
// RetryAfter − 1 ms is therefore given at an instant the store would have
// denied too. The argument needs the local clock (monotonic, see
// Options.Now) to run no slower than the store's; a store clock that jumps
// forward is one of the events bounded by Options.MaxTTL (below). The clock
// for a local answer is read after the entries were looked up, so that the
// instant the answer stands for lies both within the Check call and after
// the store decision that created each entry.
//
// With a shared millisecond clock (the tests: pkg/memorybackend or Redis
// with an injected clock) the entry expires exactly at the last denied
// millisecond, and a local answer equals the store's bit for bit.
//
// # The local answer
//
// Every Result of a batch answered locally is: Allowed false, Remaining 0
// (exact: a counter that denies one hit has nothing remaining, in every
// algorithm), RetryAfter and ResetAfter the store's figures aged by the
// elapsed local time e = now − at rounded up to the millisecond:
//
//   - RetryAfter = RetryAfter − e ≥ 1 ms. It is exact when no other
//     instance uses the counter; otherwise it may be early (their traffic
//     postpones the true instant, and the store decided after at). Early is
//     the safe direction for Retry-After: the client retries and is denied
//     again with a fresh figure, whereas a late one would make it wait for
//     nothing. It is never later than the true instant by more than the
//     store clock's granularity (under 1 ms).
//   - ResetAfter: fixed and sliding windows report the time to the end of
//     the current window, a function of the clock alone, aged modulo the
//     window; a token bucket's time until full shrinks one for one; a sliding
//     log's time until its oldest hit leaves shrinks one for one, and its
//     entries are only used until that hit leaves (after that the next
//     oldest is unknown). Exact except that a token bucket's may be early
//     when other instances use the counter.
//
// Only requests with Hits 0 or 1 are answered locally: a request for more
// hits is denied too, but its RetryAfter would be earlier than the store's,
// and requests above the capacity get the window as a hint from the store.
//
// # Batches
//
// A batch is answered locally only when every request of it is answered by
// a valid entry (shadow requests included: a denial reads the same counter
// whether or not it may veto, and a batch in which every request is denied
// consumes nothing either way). When only some are, the whole batch goes to
// the inner limiter unchanged: the other requests need the store, and the
// batch must stay all-or-nothing with their results computed as the store
// computes them (with the tentative consumption of earlier requests of the
// batch, which sending them with Hits 0 would lose).
//
// # What a cache cannot see
//
// The guarantee assumes that the store's counters change only by the
// algorithms: consumption and the passage of time. Anything that lowers a
// counter otherwise makes the store admit before the cached instant, and the
// cache keeps denying the key until its entry expires:
//
//   - Redis Cluster refunds: a batch spanning slots consumes on one slot and
//     gives the hits back when another slot denies; a request on the first
//     slot between the two calls is denied on the inflated count. Without
//     the cache this over-denial lasts for the refund's round trip; with it,
//     for that request's RetryAfter (at most MaxTTL) on this instance.
//   - Counters lost or reset: a Redis restart without persistence, FLUSHDB or
//     DEL by an operator, a failover to a replica that missed writes,
//     eviction under maxmemory.
//   - The store's clock jumping forward.
//
// None of these ever makes the cache admit: it only answers "denied". Each
// is bounded by Options.MaxTTL (default 1 s): no entry answers for longer
// than that after the store's answer, so a hot denied key still costs at
// most one store call per MaxTTL per instance.
//
// # Memory
//
// At most Options.MaxEntries entries (default 100,000) are kept, in
// Options.Shards independently locked maps. An entry takes 64 bytes in its
// map, whatever the length of its counter's key: a 128-bit identity of the
// counter (below) and 48 bytes of figures. With the maps' spare slots (a
// table is 7/16 to 7/8 full) that is 74 to 149 bytes of heap per entry: 94
// measured for a full cache of the default size (9.4 MB), 119 at 10,000
// entries, for keys of 16 bytes as of 5,000 (TestEntryMemory). No byte of a
// key is kept, so neither is the request buffer a key may be part of.
//
// Expired entries are deleted when they are looked up; an insert into a
// full shard first deletes the shard's expired entries (at most once per
// expiry instant, so a full shard of live entries costs no scan) and is
// skipped when the shard is still full. Expired entries count towards
// MaxEntries, so they never take memory beyond that bound, and there is no
// background sweep (it would not return memory either: a Go map keeps its
// size after deletions). There is no goroutine. Stats and Len report what
// the cache does.
//
// # Identity and collisions
//
// An entry is found by two 64-bit hashes (hash/maphash, under two seeds the
// Cache draws at random in New) of its counter's storage identity: the key,
// algorithm and window, hashed as one value, the key by its length and its
// bytes, so that two different counters are always two different inputs.
// Two counters share an entry only if both hashes collide; then a denial of
// one would answer the other, a wrong denial. Clients choose the descriptor
// values in keys, but not the seeds: those never leave the process and
// differ at every start, so a client cannot search for a collision, and the
// identities of the counters it sends are as good as random 128-bit
// numbers. A lookup then meets another counter's identity among at most
// MaxEntries with probability MaxEntries/2^128, under 10^-33: a million
// lookups a second for a century (3·10^15) make about 10^-18, far below the
// rate of memory errors. Were it to happen, the entry would further need the
// same Requests and Burst to answer, and would answer for at most MaxTTL.
// Keeping the keys instead would make an entry's memory that of its key, up
// to several kilobytes each.
//
// A *Cache is safe for concurrent use.
package denycache
