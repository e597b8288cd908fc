package denycache

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// Defaults of Options.
const (
	// DefaultMaxEntries bounds the number of cached denials.
	DefaultMaxEntries = 100_000
	// DefaultShards is the number of independently locked maps.
	DefaultShards = 64
	// DefaultMaxTTL bounds how long an entry answers after the store's
	// denial, whatever its RetryAfter (see the package documentation, "What
	// a cache cannot see").
	DefaultMaxTTL = time.Second
)

// Options configures a Cache. The zero value takes every default.
type Options struct {
	// MaxEntries is the largest number of entries kept. Default
	// DefaultMaxEntries. An entry's size does not depend on its
	// Request.Key (see the package documentation, "Memory").
	MaxEntries int
	// Shards is the number of independently locked maps the entries are
	// spread over. Default DefaultShards; at most MaxEntries.
	Shards int
	// MaxTTL caps how long after the store's answer an entry is used.
	// 0 means DefaultMaxTTL; a negative value means no cap (entries live
	// for the store's full RetryAfter).
	MaxTTL time.Duration
	// Now is the local clock. Default time.Now, whose monotonic reading
	// makes the cache immune to wall-clock steps; tests inject the clock
	// the inner limiter decides at. It must not run backwards.
	Now func() time.Time
}

// Stats are counters of a Cache since it was created.
type Stats struct {
	// Answered counts batches answered without the inner limiter.
	Answered uint64
	// Forwarded counts batches passed to the inner limiter.
	Forwarded uint64
	// Recorded counts denials stored (new entries and refreshed ones).
	Recorded uint64
	// Skipped counts denials not stored because their shard was full of
	// live entries.
	Skipped uint64
}

// Cache is a limiter.Limiter that answers batches of known denials locally
// and passes every other batch to the limiter it wraps (see the package
// documentation). It is safe for concurrent use. It has no goroutine and
// nothing to close.
type Cache struct {
	next     limiter.Limiter
	now      func() time.Time
	epoch    time.Time // instants are kept as nanoseconds since epoch
	maxTTL   int64     // ns; 0: no cap
	perShard int
	seeds    [2]maphash.Seed // of ident's two halves
	shards   []shard

	answered, forwarded, recorded, skipped atomic.Uint64
}

var _ limiter.Limiter = (*Cache)(nil)

// shard is one locked part of the cache.
type shard struct {
	mu sync.Mutex
	m  map[ident]entry
	// noSweepBefore is the earliest expiry seen by the last sweep that
	// left the shard full: until then a sweep would delete nothing.
	noSweepBefore int64
	_             [32]byte // keep neighbouring shards' mutexes off one cache line
}

// ident stands for a counter's storage identity (Request.Key,
// Limit.Algorithm, Limit.Window): two 64-bit hashes of it under the Cache's
// two seeds. An entry holds no part of the key (see the package
// documentation, "Memory").
type ident struct{ a, b uint64 }

// counter is a counter's storage identity.
type counter struct {
	key    string
	window time.Duration
	alg    limiter.Algorithm
}

// counterOf returns the storage identity of r's counter.
func counterOf(r *limiter.Request) counter {
	return counter{key: r.Key, window: r.Limit.Window, alg: r.Limit.Algorithm}
}

// identOf returns the ident of r's counter. maphash.Comparable hashes the
// counter field by field, the key by its length and bytes, so two different
// identities are two different inputs and only the hashes can collide.
func (c *Cache) identOf(r *limiter.Request) ident {
	v := counterOf(r)
	return ident{a: maphash.Comparable(c.seeds[0], v), b: maphash.Comparable(c.seeds[1], v)}
}

// entry is a denial of one hit by the store, under the limit numbers
// requests and burst.
type entry struct {
	at       int64 // ns since epoch: the clock before the inner call was sent
	until    int64 // ns since epoch: the last instant the denial is certain
	retry    int64 // the store's RetryAfter, ms
	reset    int64 // the store's ResetAfter, ms
	requests uint64
	burst    uint64
}

// New returns a Cache in front of next.
func New(next limiter.Limiter, o Options) (*Cache, error) {
	if next == nil {
		return nil, errors.New("denycache: nil limiter")
	}
	if o.MaxEntries < 0 || o.Shards < 0 {
		return nil, fmt.Errorf("denycache: negative MaxEntries (%d) or Shards (%d)", o.MaxEntries, o.Shards)
	}
	if o.MaxEntries == 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.Shards == 0 {
		o.Shards = DefaultShards
	}
	o.Shards = min(o.Shards, o.MaxEntries)
	switch {
	case o.MaxTTL == 0:
		o.MaxTTL = DefaultMaxTTL
	case o.MaxTTL < 0:
		o.MaxTTL = 0
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	c := &Cache{
		next:     next,
		now:      o.Now,
		epoch:    o.Now(),
		maxTTL:   int64(o.MaxTTL),
		perShard: o.MaxEntries / o.Shards,
		seeds:    [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		shards:   make([]shard, o.Shards),
	}
	for i := range c.shards {
		c.shards[i].m = make(map[ident]entry)
	}
	return c, nil
}

// Stats returns the Cache's counters.
func (c *Cache) Stats() Stats {
	return Stats{
		Answered:  c.answered.Load(),
		Forwarded: c.forwarded.Load(),
		Recorded:  c.recorded.Load(),
		Skipped:   c.skipped.Load(),
	}
}

// Len returns the number of entries held, expired ones included until they
// are deleted.
func (c *Cache) Len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// clock returns the local time in ns since c.epoch.
func (c *Cache) clock() int64 { return int64(c.now().Sub(c.epoch)) }

// shardOf returns the shard of id (a seeded hash: its bits are uniform).
func (c *Cache) shardOf(id ident) *shard {
	return &c.shards[id.a%uint64(len(c.shards))]
}

// smallBatch is the batch size looked up without heap allocation.
const smallBatch = 8

// Check implements limiter.Limiter: it answers reqs locally when every
// request is a cached denial, and otherwise passes the batch to the wrapped
// limiter unchanged and remembers the denials it returns.
func (c *Cache) Check(ctx context.Context, reqs []limiter.Request, results []limiter.Result) error {
	if len(reqs) == 0 || len(results) != len(reqs) {
		return c.next.Check(ctx, reqs, results)
	}
	var buf [smallBatch]entry
	found := buf[:0]
	if len(reqs) > smallBatch {
		found = make([]entry, 0, len(reqs))
	}
	for i := range reqs {
		e, ok := c.lookup(&reqs[i])
		if !ok {
			break
		}
		found = append(found, e)
	}
	// Read after the lookups: the instant a local answer stands for must
	// follow the store decisions that created the entries (see the
	// package documentation). It also precedes the inner call.
	now := c.clock()
	if len(found) == len(reqs) && c.answer(now, reqs, found, results) {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("denycache: %w", err)
		}
		c.answered.Add(1)
		return nil
	}
	c.forwarded.Add(1)
	if err := c.next.Check(ctx, reqs, results); err != nil {
		return err
	}
	c.record(now, reqs, results)
	return nil
}

// lookup returns the entry that may answer r, valid or not: answer checks
// its validity at an instant read after every lookup.
func (c *Cache) lookup(r *limiter.Request) (entry, bool) {
	if r.Hits > 1 {
		return entry{}, false
	}
	id := c.identOf(r)
	s := c.shardOf(id)
	s.mu.Lock()
	e, ok := s.m[id]
	s.mu.Unlock()
	return e, ok && e.requests == r.Limit.Requests && e.burst == r.Limit.Burst
}

// answer writes the local answer at now for reqs from their entries and
// reports whether every entry was still valid.
func (c *Cache) answer(now int64, reqs []limiter.Request, found []entry, results []limiter.Result) bool {
	for i := range found {
		if e := &found[i]; now < e.at || now > e.until {
			if now > e.until {
				c.drop(&reqs[i], e.until, now)
			}
			return false
		}
	}
	for i := range found {
		e := &found[i]
		elapsed := ceilMillis(now - e.at)
		results[i] = limiter.Result{
			Allowed:    false,
			Remaining:  0,
			ResetAfter: time.Duration(agedReset(&reqs[i].Limit, e.reset, elapsed)) * time.Millisecond,
			RetryAfter: time.Duration(e.retry-elapsed) * time.Millisecond,
			Source:     limiter.SourceStore,
		}
	}
	return true
}

// drop deletes r's entry if it is still the expired one (until).
func (c *Cache) drop(r *limiter.Request, until, now int64) {
	id := c.identOf(r)
	s := c.shardOf(id)
	s.mu.Lock()
	if e, ok := s.m[id]; ok && e.until == until && now > e.until {
		delete(s.m, id)
	}
	s.mu.Unlock()
}

// agedReset returns a ResetAfter of reset ms, elapsed ms later.
func agedReset(l *limiter.Limit, reset, elapsed int64) int64 {
	switch l.Algorithm {
	case limiter.SlidingWindow, limiter.FixedWindow:
		// The end of the window the store reported (more than W away
		// when its clock had stepped back, see algorithm.behind), then
		// of each epoch-aligned window after it: in (0, W].
		r := reset - elapsed
		if r > 0 {
			return r
		}
		w := l.Window.Milliseconds()
		r %= w
		if r <= 0 {
			r += w
		}
		return r
	default:
		// Token bucket: until full; sliding log: until the oldest hit
		// leaves (entries are only used before it does).
		return max(0, reset-elapsed)
	}
}

// ceilMillis is ns rounded up to whole milliseconds.
func ceilMillis(ns int64) int64 {
	return (ns + int64(time.Millisecond) - 1) / int64(time.Millisecond)
}

// record remembers the denials among results of a batch the inner limiter
// decided, sent at the local time at, and forgets the entries of counters
// the batch consumed on (their figures would be stale).
func (c *Cache) record(at int64, reqs []limiter.Request, results []limiter.Result) {
	committed := true
	for i := range results {
		if !results[i].Allowed && !reqs[i].Shadow {
			committed = false
			break
		}
	}
	for i := range results {
		r, q := &results[i], &reqs[i]
		if r.Allowed {
			if committed && q.Hits > 0 {
				c.forget(q)
			}
			continue
		}
		if r.Source != limiter.SourceStore || q.Hits > 1 ||
			r.RetryAfter < time.Millisecond || r.ResetAfter < 0 || sharesCounter(reqs[:i], q) {
			continue
		}
		retry, reset := r.RetryAfter.Milliseconds(), r.ResetAfter.Milliseconds()
		valid := retry
		if q.Limit.Algorithm == limiter.SlidingLog {
			// After the oldest hit leaves, ResetAfter is unknown.
			valid = min(valid, reset)
		}
		if valid < 1 {
			continue
		}
		until := at + valid*int64(time.Millisecond) - int64(time.Millisecond)
		if c.maxTTL > 0 {
			until = min(until, at+c.maxTTL-int64(time.Millisecond))
		}
		if until < at {
			continue
		}
		c.insert(q, entry{at: at, until: until, retry: retry, reset: reset,
			requests: q.Limit.Requests, burst: q.Limit.Burst})
	}
}

// forget deletes the entry of q's counter.
func (c *Cache) forget(q *limiter.Request) {
	id := c.identOf(q)
	s := c.shardOf(id)
	s.mu.Lock()
	if len(s.m) > 0 {
		delete(s.m, id)
	}
	s.mu.Unlock()
}

// sharesCounter reports whether one of earlier counts on q's counter.
func sharesCounter(earlier []limiter.Request, q *limiter.Request) bool {
	for i := range earlier {
		if counterOf(&earlier[i]) == counterOf(q) {
			return true
		}
	}
	return false
}

// insert stores e for q unless q's shard is full of live entries.
func (c *Cache) insert(q *limiter.Request, e entry) {
	id := c.identOf(q)
	s := c.shardOf(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[id]; !ok && len(s.m) >= c.perShard {
		now := c.clock()
		if now < s.noSweepBefore || !s.sweep(now) {
			c.skipped.Add(1)
			return
		}
	}
	s.m[id] = e
	// An entry that expires before the last fruitless sweep's earliest
	// expiry (room was made by a forget, not a sweep) makes sweeping useful
	// from its expiry on.
	s.noSweepBefore = min(s.noSweepBefore, e.until+1)
	c.recorded.Add(1)
}

// sweep deletes the entries expired at now and reports whether any was.
// When none was, it remembers the earliest expiry, before which sweeping
// again is useless. s.mu is held.
func (s *shard) sweep(now int64) bool {
	deleted := false
	next := int64(1<<63 - 1)
	for id, e := range s.m {
		if e.until < now {
			delete(s.m, id)
			deleted = true
		} else {
			next = min(next, e.until+1)
		}
	}
	if !deleted {
		s.noSweepBefore = next
	}
	return deleted
}
