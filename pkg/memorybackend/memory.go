package memorybackend

import (
	"context"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/algorithm"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// Options configures a Backend. The zero value is usable.
type Options struct {
	// Now is the clock decisions are made at. Default time.Now.
	Now func() time.Time
	// Shards is the number of independently locked parts of the counter
	// map. Default 64.
	Shards int
	// SweepInterval is how often a goroutine deletes expired counters.
	// Default 1 minute; negative disables the sweeper (expired counters are
	// still ignored, but their memory is only reclaimed when they are
	// written again).
	SweepInterval time.Duration

	// afterSweep, if set, is called by the sweeper after each sweep with
	// the number of counters deleted (tests only).
	afterSweep func(deleted int)
}

// Backend is an in-process limiter.Limiter. It is safe for concurrent use.
// Close stops its sweeper goroutine.
type Backend struct {
	now    func() time.Time
	seed   maphash.Seed
	shards []shard

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// shard is one locked part of the counter map.
type shard struct {
	mu sync.Mutex
	m  map[ident]entry
	_  [40]byte // keep neighbouring shards' mutexes off one cache line
}

// ident is the storage identity of a counter: Key, Algorithm, Window.
type ident struct {
	key    string
	alg    limiter.Algorithm
	window time.Duration
}

// entry is a stored counter; it is absent from expires (ms) on.
type entry struct {
	expires int64
	state   algorithm.State
	// key is the map key's own copy of the counter's key. A request's
	// keys are substrings of one string (all of them); a write gives the
	// map this copy, not the request's (a map assignment replaces a string
	// key), so that a counter keeps only its own key's bytes.
	key string
}

// New returns a Backend with its sweeper running (unless disabled).
func New(o Options) *Backend {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Shards <= 0 {
		o.Shards = 64
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = time.Minute
	}
	b := &Backend{
		now:    o.Now,
		seed:   maphash.MakeSeed(),
		shards: make([]shard, o.Shards),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	for i := range b.shards {
		b.shards[i].m = make(map[ident]entry)
	}
	if o.SweepInterval < 0 {
		close(b.done)
		return b
	}
	go b.sweeper(o.SweepInterval, o.afterSweep)
	return b
}

// Close stops the sweeper and waits for it to return. It is idempotent and
// always returns nil. Check keeps working after Close.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() { close(b.stop) })
	<-b.done
	return nil
}

func (b *Backend) sweeper(every time.Duration, after func(int)) {
	defer close(b.done)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-tick.C:
			n := b.sweep(b.now().UnixMilli())
			if after != nil {
				after(n)
			}
		}
	}
}

// sweep deletes the counters expired at now and returns how many.
func (b *Backend) sweep(now int64) int {
	n := 0
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		for id, e := range s.m {
			if e.expires <= now {
				delete(s.m, id)
				n++
			}
		}
		s.mu.Unlock()
	}
	return n
}

// Len returns the number of live (unexpired) counters.
func (b *Backend) Len() int {
	now := b.now().UnixMilli()
	n := 0
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		for _, e := range s.m {
			if e.expires > now {
				n++
			}
		}
		s.mu.Unlock()
	}
	return n
}

func (b *Backend) shardOf(id ident) int {
	x := maphash.String(b.seed, id.key)
	x ^= uint64(id.window)*0x9e3779b97f4a7c15 + uint64(id.alg)
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 29
	return int(x % uint64(len(b.shards)))
}

// smallBatch is the batch size handled without heap allocation.
const smallBatch = 8

// pending is one counter of a batch: its stored and its tentative state.
type pending struct {
	id          ident
	shard       int
	limit       limiter.Limit // of the last consuming request (of the first request until then)
	requests    int           // the batch's requests on it
	stored, cur algorithm.State
	dirty       bool
	known       bool // id.key is the map's copy (entry.key)
}

// Check decides reqs atomically at the Backend's clock and writes one
// Result per Request (see limiter.Limiter). It never blocks on anything but
// its own shard locks, so it only looks at ctx on entry: a Check with an
// ended context fails with ctx.Err() wrapped.
func (b *Backend) Check(ctx context.Context, reqs []limiter.Request, results []limiter.Result) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memorybackend: %w", err)
	}
	if len(results) != len(reqs) {
		return fmt.Errorf("memorybackend: %d results for %d requests: %w", len(results), len(reqs), limiter.ErrInvalid)
	}
	for i := range reqs {
		if reqs[i].Key == "" {
			return fmt.Errorf("memorybackend: request %d: empty key: %w", i, limiter.ErrInvalid)
		}
		if err := reqs[i].Limit.Validate(); err != nil {
			return fmt.Errorf("memorybackend: request %d: %w", i, err)
		}
		// As the Redis backend: the configuration counts nothing beyond
		// it, and the algorithms' sums need it (a sliding log's limit
		// below 2^62).
		if err := reqs[i].Limit.ExactRange(); err != nil {
			return fmt.Errorf("memorybackend: request %d: %w: %w", i, limiter.ErrInvalid, err)
		}
	}
	if len(reqs) == 0 {
		return nil
	}

	// The batch's distinct counters, and for each request its counter.
	var pendBuf [smallBatch]pending
	var ofBuf [smallBatch]int
	var lockBuf [smallBatch]int
	pend, of, locks := pendBuf[:0], ofBuf[:0], lockBuf[:0]
	if len(reqs) > smallBatch {
		pend = make([]pending, 0, len(reqs))
		of = make([]int, 0, len(reqs))
		locks = make([]int, 0, len(reqs))
	}
	for i := range reqs {
		id := ident{key: reqs[i].Key, alg: reqs[i].Limit.Algorithm, window: reqs[i].Limit.Window}
		j := 0
		for j < len(pend) && pend[j].id != id {
			j++
		}
		if j == len(pend) {
			sh := b.shardOf(id)
			pend = append(pend, pending{id: id, shard: sh, limit: reqs[i].Limit})
			locks = insertSorted(locks, sh)
		}
		pend[j].requests++
		of = append(of, j)
	}

	for _, sh := range locks {
		b.shards[sh].mu.Lock()
	}
	now := b.now().UnixMilli()
	for j := range pend {
		p := &pend[j]
		m := b.shards[p.shard].m
		e, ok := m[p.id]
		if ok {
			p.id.key, p.known = e.key, true
		}
		if ok && e.expires > now {
			// Room for the batch's appends in place (a sliding log),
			// stored at once so that it is kept if the batch is vetoed.
			var copied bool
			if p.stored, copied = algorithm.Reserve(p.limit, e.state, p.requests); copied {
				m[p.id] = entry{expires: e.expires, state: p.stored, key: e.key}
			}
			p.cur = p.stored
		}
	}
	ok := true
	for i := range reqs {
		r := &reqs[i]
		p := &pend[of[i]]
		// The shard's lock is held and only the stored state outlives
		// the Check, so a sliding log may append in place.
		d, ns := algorithm.DecideOwned(r.Limit, p.cur, now, r.Hits)
		results[i] = limiter.Result{Allowed: d.Allowed, Remaining: d.Remaining, ResetAfter: d.ResetAfter,
			RetryAfter: d.RetryAfter, Source: limiter.SourceStore}
		if d.Allowed && r.Hits > 0 {
			p.cur, p.dirty, p.limit = ns, true, r.Limit
		}
		if !d.Allowed && !r.Shadow {
			ok = false
		}
	}
	if !ok {
		for i := range reqs {
			d, _ := algorithm.Decide(reqs[i].Limit, pend[of[i]].stored, now, 0)
			results[i].Remaining, results[i].ResetAfter = d.Remaining, d.ResetAfter
		}
	}
	for j := range pend {
		if p := &pend[j]; ok && p.dirty {
			if !p.known {
				p.id.key = strings.Clone(p.id.key)
			}
			b.shards[p.shard].m[p.id] = entry{expires: algorithm.ExpiresAt(p.limit, p.cur), state: p.cur, key: p.id.key}
		}
	}
	for k := len(locks) - 1; k >= 0; k-- {
		b.shards[locks[k]].mu.Unlock()
	}
	return nil
}

// insertSorted adds v to the ascending set s unless present.
func insertSorted(s []int, v int) []int {
	i := len(s)
	for i > 0 && s[i-1] > v {
		i--
	}
	if i > 0 && s[i-1] == v {
		return s
	}
	s = append(s, 0)
	copy(s[i+1:], s[i:])
	s[i] = v
	return s
}
