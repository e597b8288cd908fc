package denycache

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
	"github.com/envoy-rls/envoy-rls/pkg/memorybackend"
)

// TestConformance runs the conformance suite on a Cache in front of the
// memory backend, both on the suite's clock: every result, cached or not,
// must equal the reference model's.
func TestConformance(t *testing.T) {
	limitertest.Run(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
		m := memorybackend.New(memorybackend.Options{Now: now, SweepInterval: -1})
		t.Cleanup(func() { m.Close() })
		c, err := New(m, Options{Now: now, MaxTTL: -1})
		if err != nil {
			t.Fatal(err)
		}
		return c
	})
}

// TestHammer runs the concurrent admission test with four instances, each
// with its own Cache, in front of one shared memory store: the admitted
// total must equal the model's exactly.
func TestHammer(t *testing.T) {
	clock := limitertest.NewClock(time.UnixMilli(start))
	m := memorybackend.New(memorybackend.Options{Now: clock.Now, Shards: 4, SweepInterval: -1})
	defer m.Close()
	caches := make([]*Cache, 4)
	ls := make([]limiter.Limiter, len(caches))
	for i := range caches {
		caches[i] = newCache(t, m, clock, Options{Shards: 2})
		ls[i] = caches[i]
	}
	limitertest.HammerAll(t, ls, clock, 16)
	var answered uint64
	for _, c := range caches {
		answered += c.Stats().Answered
	}
	if answered == 0 {
		t.Error("no batch was answered by a cache: the hammer did not exercise it")
	}
}

// TestDifferential feeds one seeded random sequence to two stores on one
// clock, one behind Caches and one without, and compares every result: hot
// keys hammered several times per millisecond across window rollovers, hits
// 0, 1 and 2, shadow requests, batches with a key twice, a limit whose
// number changes. With one instance (one Cache) the results must be
// identical. With two instances (two Caches in front of one store, taking
// turns at random) a Cache cannot see the other's consumption: decisions
// and Remaining must still be identical, and RetryAfter (and a token
// bucket's ResetAfter) may only be early.
func TestDifferential(t *testing.T) {
	for _, instances := range []int{1, 2} {
		for _, alg := range algorithms {
			for _, wms := range []int64{10, 250, 1000} {
				t.Run(fmt.Sprintf("instances%d/%v/W%dms", instances, alg, wms), func(t *testing.T) {
					differential(t, instances, alg, wms)
				})
			}
		}
	}
}

func differential(t *testing.T, instances int, alg limiter.Algorithm, wms int64) {
	clock := limitertest.NewClock(time.UnixMilli(start))
	counted := &counting{next: newMemory(t, clock), clock: clock}
	caches := make([]*Cache, instances)
	for i := range caches {
		caches[i] = newCache(t, counted, clock, Options{})
	}
	plain := newMemory(t, clock)

	w := time.Duration(wms) * time.Millisecond
	limits := []limiter.Limit{
		{Algorithm: alg, Requests: 5, Window: w},
		{Algorithm: alg, Requests: 8, Window: w}, // the same counter, another number
		{Algorithm: alg, Requests: 3, Window: w, Burst: 6},
	}
	rng := rand.New(rand.NewPCG(uint64(alg)+uint64(instances)<<8, uint64(wms)))
	keys := []string{"hot", "warm", "cold"}
	const steps = 3000
	for step := range steps {
		if rng.IntN(4) == 0 {
			clock.Advance(ms(rng.Int64N(wms/5 + 2)))
		}
		n := 1 + rng.IntN(3)
		if rng.IntN(2) == 0 {
			n = 1
		}
		reqs := make([]limiter.Request, n)
		for i := range reqs {
			k := keys[min(rng.IntN(5), 2)] // mostly "hot"
			l := limits[0]
			if p := rng.IntN(20); p == 0 {
				l = limits[1]
			} else if p == 1 {
				l = limits[2]
			}
			hits := uint64(1)
			if p := rng.IntN(10); p == 0 {
				hits = 0
			} else if p == 1 {
				hits = 2
			}
			reqs[i] = limiter.Request{Key: k, Limit: l, Hits: hits, Shadow: rng.IntN(8) == 0}
		}
		got, want := check(t, caches[rng.IntN(instances)], reqs...), check(t, plain, reqs...)
		for i := range reqs {
			g, u := got[i], want[i]
			ok := g == u
			if instances > 1 {
				early := g.RetryAfter <= u.RetryAfter && (g.RetryAfter > 0) == (u.RetryAfter > 0)
				reset := g.ResetAfter == u.ResetAfter ||
					alg == limiter.TokenBucket && g.ResetAfter <= u.ResetAfter
				ok = g.Allowed == u.Allowed && g.Remaining == u.Remaining && g.Source == u.Source && early && reset
			}
			if !ok {
				t.Fatalf("step %d at +%dms, request %d of %+v:\n cached   %+v\n uncached %+v",
					step, clock.Millis()-start, i, reqs, g, u)
			}
		}
	}
	var st Stats
	for _, c := range caches {
		s := c.Stats()
		st.Answered += s.Answered
		st.Forwarded += s.Forwarded
		st.Recorded += s.Recorded
	}
	if st.Answered == 0 || st.Recorded == 0 {
		t.Fatalf("stats %+v: the caches answered nothing, the test does not exercise them", st)
	}
	if got := len(counted.log()); uint64(got) != st.Forwarded {
		t.Fatalf("the store saw %d calls, Stats.Forwarded = %d", got, st.Forwarded)
	}
	t.Logf("%d batches: %d answered locally, %d forwarded", steps, st.Answered, st.Forwarded)
}

// TestAbsorbsDenials hammers one key far over its limit, several requests
// per millisecond for several windows, and checks from the inner limiter's
// log that every denial it saw was necessary: no forwarded denial fell
// within the validity of an earlier one (its RetryAfter, capped by MaxTTL),
// and denials mostly stayed local.
func TestAbsorbsDenials(t *testing.T) {
	for _, alg := range algorithms {
		for _, maxTTL := range []time.Duration{-1, 0, 70 * time.Millisecond} {
			t.Run(fmt.Sprintf("%v/MaxTTL%v", alg, maxTTL), func(t *testing.T) {
				clock := limitertest.NewClock(time.UnixMilli(start))
				counted := &counting{next: newMemory(t, clock), clock: clock}
				c := newCache(t, counted, clock, Options{MaxTTL: maxTTL})
				l := limiter.Limit{Algorithm: alg, Requests: 10, Window: 500 * time.Millisecond}
				r := limiter.Request{Key: "hot", Limit: l, Hits: 1}
				denied := 0
				for range 3 * 500 {
					for range 4 {
						if !check(t, c, r)[0].Allowed {
							denied++
						}
					}
					clock.Advance(time.Millisecond)
				}
				forwarded := forwardedDenials(t, counted.log(), maxTTL)
				if forwarded == 0 || denied < 10*forwarded {
					t.Fatalf("%d denials, %d of them reached the store: the cache did not absorb them", denied, forwarded)
				}
				t.Logf("%d denials, %d reached the store", denied, forwarded)
			})
		}
	}
}

// forwardedDenials checks that every denial in the log of the calls a Cache
// forwarded was necessary: none fell within the validity of an earlier
// denial of the same counter (its RetryAfter — for a sliding log at most its
// ResetAfter — capped by maxTTL as Options.MaxTTL says). It returns their
// number. Every call of the log holds one request.
func forwardedDenials(t *testing.T, log []call, maxTTL time.Duration) int {
	t.Helper()
	cap := int64(-1)
	if maxTTL == 0 {
		cap = DefaultMaxTTL.Milliseconds()
	} else if maxTTL > 0 {
		cap = maxTTL.Milliseconds()
	}
	forwarded := 0
	validUntil := map[counter]int64{} // last ms answerable by the latest forwarded denial
	for _, k := range log {
		q, r := k.reqs[0], k.res[0]
		id := counterOf(&q)
		if r.Allowed {
			delete(validUntil, id)
			continue
		}
		forwarded++
		if u, ok := validUntil[id]; ok && k.at <= u {
			t.Fatalf("a denial at +%dms reached the store although the store's denial of %q was valid until +%dms",
				k.at-start, q.Key, u-start)
		}
		valid := r.RetryAfter.Milliseconds()
		if q.Limit.Algorithm == limiter.SlidingLog {
			valid = min(valid, r.ResetAfter.Milliseconds())
		}
		if cap > 0 {
			valid = min(valid, cap)
		}
		validUntil[id] = k.at + valid - 1
	}
	return forwarded
}

// TestNotCached checks the denials a Cache must not remember.
func TestNotCached(t *testing.T) {
	l := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 2, Window: time.Second}
	t.Run("fallback", func(t *testing.T) {
		clock := limitertest.NewClock(time.UnixMilli(start))
		c := newCache(t, sourced{next: newMemory(t, clock), src: limiter.SourceFallback}, clock, Options{})
		r := limiter.Request{Key: "k", Limit: l, Hits: 1}
		for range 5 {
			check(t, c, r)
		}
		if n := c.Len(); n != 0 || c.Stats().Answered != 0 {
			t.Fatalf("fallback denials cached: %d entries, stats %+v", n, c.Stats())
		}
	})
	t.Run("more hits", func(t *testing.T) {
		clock := limitertest.NewClock(time.UnixMilli(start))
		c := newCache(t, newMemory(t, clock), clock, Options{})
		r := limiter.Request{Key: "k", Limit: l, Hits: 2}
		check(t, c, r)
		if res := check(t, c, r); res[0].Allowed {
			t.Fatalf("third and fourth hit admitted: %+v", res[0])
		}
		if n := c.Len(); n != 0 {
			t.Fatalf("a denial of 2 hits was cached: %d entries", n)
		}
	})
	t.Run("denied by an earlier request of the batch", func(t *testing.T) {
		clock := limitertest.NewClock(time.UnixMilli(start))
		c := newCache(t, newMemory(t, clock), clock, Options{})
		r := limiter.Request{Key: "k", Limit: l, Hits: 1}
		check(t, c, r)
		// One left: the batch's first request takes it tentatively, the
		// second is denied on that, and the batch consumes nothing.
		if res := check(t, c, r, r); !res[0].Allowed || res[1].Allowed {
			t.Fatalf("batch of two on one left: %+v", res)
		}
		if n := c.Len(); n != 0 {
			t.Fatalf("a denial caused by the batch itself was cached: %d entries", n)
		}
		if res := check(t, c, r); !res[0].Allowed {
			t.Fatalf("the last hit was not admitted: %+v", res[0])
		}
	})
	t.Run("other numbers", func(t *testing.T) {
		clock := limitertest.NewClock(time.UnixMilli(start))
		c := newCache(t, newMemory(t, clock), clock, Options{})
		r := limiter.Request{Key: "k", Limit: l, Hits: 1}
		check(t, c, r, r)
		if res := check(t, c, r); res[0].Allowed || c.Len() != 1 {
			t.Fatalf("full counter: %+v, %d entries", res[0], c.Len())
		}
		more := r
		more.Limit.Requests = 3
		if res := check(t, c, more); !res[0].Allowed {
			t.Fatalf("a raised limit was answered by the entry of the old one: %+v", res[0])
		}
	})
}

// TestMaxTTL checks that an entry stops answering MaxTTL after the store's
// denial, although the denial lasts longer.
func TestMaxTTL(t *testing.T) {
	clock := limitertest.NewClock(time.UnixMilli(start))
	counted := &counting{next: newMemory(t, clock), clock: clock}
	c := newCache(t, counted, clock, Options{MaxTTL: 50 * time.Millisecond})
	r := limiter.Request{Key: "k", Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1, Window: time.Minute}, Hits: 1}
	check(t, c, r)
	first := check(t, c, r)[0]
	if first.Allowed || first.RetryAfter <= 50*time.Millisecond {
		t.Fatalf("second hit: %+v, want a denial longer than MaxTTL", first)
	}
	calls := len(counted.log())
	clock.Advance(49 * time.Millisecond)
	check(t, c, r)
	if n := len(counted.log()); n != calls {
		t.Fatalf("within MaxTTL the store was asked (%d calls, want %d)", n, calls)
	}
	clock.Advance(time.Millisecond)
	if res := check(t, c, r)[0]; res.Allowed || len(counted.log()) != calls+1 {
		t.Fatalf("after MaxTTL: %+v with %d store calls, want a denial from the store (%d calls)", res, len(counted.log()), calls+1)
	}
}

// TestBounded sends denials of a million distinct keys: the cache never
// holds more than MaxEntries, skips what does not fit, and makes room once
// entries expire.
func TestBounded(t *testing.T) {
	clock := limitertest.NewClock(time.UnixMilli(start))
	c := newCache(t, denyAll{}, clock, Options{})
	l := limiter.Limit{Requests: 1, Window: time.Minute}
	res := make([]limiter.Result, 1)
	reqs := make([]limiter.Request, 1)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const keys = 1_000_000
	for i := range keys {
		reqs[0] = limiter.Request{Key: fmt.Sprintf("key-%07d", i), Limit: l, Hits: 1}
		if err := c.Check(context.Background(), reqs, res); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	n := c.Len()
	if n > DefaultMaxEntries || n < DefaultMaxEntries*9/10 {
		t.Fatalf("%d entries after %d distinct denials, want at most %d (and close to it)", n, keys, DefaultMaxEntries)
	}
	st := c.Stats()
	if st.Recorded != uint64(n) || st.Skipped != keys-uint64(n) {
		t.Fatalf("stats %+v with %d entries", st, n)
	}
	t.Logf("%d entries, about %d bytes each (heap)", n, (int64(after.HeapAlloc)-int64(before.HeapAlloc))/int64(n))

	// Once the entries expire, new denials take their place.
	clock.Advance(2 * DefaultMaxTTL)
	for i := range 1000 {
		reqs[0] = limiter.Request{Key: fmt.Sprintf("new-%d", i), Limit: l, Hits: 1}
		if err := c.Check(context.Background(), reqs, res); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.Stats().Recorded - st.Recorded; got != 1000 {
		t.Fatalf("after expiry %d of 1000 new denials were recorded", got)
	}
	if n := c.Len(); n > DefaultMaxEntries || n >= DefaultMaxEntries*9/10 {
		t.Fatalf("%d entries after expiry: full shards were not swept", n)
	}
}

// TestSweptAfterAForget: a full shard is swept when it holds an expired
// entry, also one stored after its last fruitless sweep, in room a forget
// made (an admission drops its counter's entry). The shard remembered only
// that sweep's earliest expiry, and skipped denials until then although an
// entry had expired since (a review's finding): more store calls, and
// envoy_rls_deny_cache_skipped_total counting them as "full of live
// entries".
func TestSweptAfterAForget(t *testing.T) {
	clock := limitertest.NewClock(time.UnixMilli(start))
	in := &scripted{retry: map[string]time.Duration{"A": 500 * time.Millisecond, "B": 500 * time.Millisecond,
		"C": 500 * time.Millisecond, "D": 10 * time.Millisecond, "E": 500 * time.Millisecond}}
	c := newCache(t, in, clock, Options{MaxEntries: 2, Shards: 1})
	l := limiter.Limit{Requests: 1, Window: time.Second}
	req := func(k string) limiter.Request { return limiter.Request{Key: k, Limit: l, Hits: 1} }
	check(t, c, req("A"))
	check(t, c, req("B"))
	check(t, c, req("C")) // full of live entries: skipped, no sweep before +500 ms
	if st := c.Stats(); st.Skipped != 1 || st.Recorded != 2 {
		t.Fatalf("after A, B, C: %+v, want 2 recorded and C skipped", st)
	}
	delete(in.retry, "B") // B admitted (its limit raised by a reload): its entry forgotten
	raised := req("B")
	raised.Limit.Requests = 2
	check(t, c, raised)
	check(t, c, req("D")) // stored, expiring at +10 ms
	clock.Advance(20 * time.Millisecond)
	check(t, c, req("E")) // the shard is full, but D has expired
	if st := c.Stats(); st.Skipped != 1 || st.Recorded != 4 {
		t.Errorf("after E: %+v, want E recorded in D's place, nothing more skipped", st)
	}
	calls := in.calls
	check(t, c, req("E"))
	if in.calls != calls {
		t.Errorf("E's denial was not cached: the second E went to the store")
	}
}

// TestEntryMemory fills a Cache with denials of distinct keys from 16 bytes
// to 5,000 (five values of 1,000 bytes), each key a part of a larger string
// as the keys of a request are parts of one buffer, and measures the heap the
// Cache holds per entry: under 200 bytes whatever the key's length, and the
// same for every length, since an entry keeps no byte of its key and so no
// reference to the buffer.
func TestEntryMemory(t *testing.T) {
	const maxEntries, bound = 10_000, 200
	var sizes []int64
	for _, n := range []int{16, 1024, 5000} {
		size := entryBytes(t, maxEntries, n)
		t.Logf("keys of %d bytes: %d bytes per entry", n, size)
		if size <= 0 || size > bound {
			t.Errorf("keys of %d bytes: %d bytes per entry, want at most %d", n, size, bound)
		}
		sizes = append(sizes, size)
	}
	if d := slices.Max(sizes) - slices.Min(sizes); d > 16 {
		t.Errorf("bytes per entry %v vary by %d with the key's length", sizes, d)
	}
}

// entryBytes returns the heap a Cache of maxEntries holds per entry once full
// of denials of distinct keys of keyLen bytes (at least 8), each a part of a
// string 4 KiB longer.
func entryBytes(t *testing.T, maxEntries, keyLen int) int64 {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	clock := limitertest.NewClock(time.UnixMilli(start))
	c := newCache(t, denyAll{}, clock, Options{MaxEntries: maxEntries})
	full := uint64(maxEntries / DefaultShards * DefaultShards)
	l := limiter.Limit{Requests: 1, Window: time.Minute}
	reqs, res := make([]limiter.Request, 1), make([]limiter.Result, 1)
	const off = 64
	buf := bytes.Repeat([]byte{'v'}, keyLen+4096)
	for i := 0; c.Stats().Recorded < full && i < 4*maxEntries; i++ {
		binary.BigEndian.PutUint64(buf[off:], uint64(i))
		whole := string(buf)
		reqs[0] = limiter.Request{Key: whole[off : off+keyLen], Limit: l, Hits: 1}
		if err := c.Check(context.Background(), reqs, res); err != nil {
			t.Fatal(err)
		}
	}
	reqs[0] = limiter.Request{}
	runtime.GC()
	runtime.ReadMemStats(&after)
	n := c.Len()
	if uint64(n) != full {
		t.Fatalf("keys of %d bytes: %d entries, want a full cache (%d)", keyLen, n, full)
	}
	runtime.KeepAlive(c)
	return (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / int64(n)
}

// TestIdentity checks that a denial answers its own counter only: the same
// key under another window or algorithm, and keys that differ from it only
// in their length, their last byte or their first, are other counters, each
// answered by its own entry once denied.
func TestIdentity(t *testing.T) {
	clock := limitertest.NewClock(time.UnixMilli(start))
	c := newCache(t, denyAll{}, clock, Options{})
	key := strings.Repeat("k", 300)
	first := limiter.Request{Key: key, Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1, Window: time.Second}, Hits: 1}
	reqs := []limiter.Request{first}
	for _, change := range []func(*limiter.Request){
		func(r *limiter.Request) { r.Limit.Window = 2 * time.Second },
		func(r *limiter.Request) { r.Limit.Window = time.Second + time.Millisecond },
		func(r *limiter.Request) { r.Limit.Algorithm = limiter.SlidingWindow },
		func(r *limiter.Request) { r.Limit.Algorithm = limiter.TokenBucket },
		func(r *limiter.Request) { r.Key = key[:299] },
		func(r *limiter.Request) { r.Key = key + "k" },
		func(r *limiter.Request) { r.Key = key[:299] + "j" },
		func(r *limiter.Request) { r.Key = "\x00" + key[1:] },
	} {
		r := first
		change(&r)
		reqs = append(reqs, r)
	}
	for i, r := range reqs {
		before := c.Stats()
		check(t, c, r)
		if st := c.Stats(); st.Answered != before.Answered || st.Recorded != before.Recorded+1 {
			t.Fatalf("request %d (key of %d bytes, %v, %v) was answered by another counter's entry: stats %+v, then %+v",
				i, len(r.Key), r.Limit.Algorithm, r.Limit.Window, before, st)
		}
	}
	for i, r := range reqs {
		before := c.Stats().Answered
		if res := check(t, c, r)[0]; res.Allowed || c.Stats().Answered != before+1 {
			t.Fatalf("request %d was not answered by its entry: %+v", i, res)
		}
	}
	if n := c.Len(); n != len(reqs) {
		t.Fatalf("%d entries for %d counters", n, len(reqs))
	}
}

// TestOptions checks New's validation and the MaxEntries bound with few
// entries.
func TestOptions(t *testing.T) {
	if _, err := New(nil, Options{}); err == nil {
		t.Error("New(nil) succeeded")
	}
	if _, err := New(denyAll{}, Options{MaxEntries: -1}); err == nil {
		t.Error("New with MaxEntries −1 succeeded")
	}
	clock := limitertest.NewClock(time.UnixMilli(start))
	c := newCache(t, denyAll{}, clock, Options{MaxEntries: 3})
	l := limiter.Limit{Requests: 1, Window: time.Minute}
	for i := range 10 {
		check(t, c, limiter.Request{Key: fmt.Sprint(i), Limit: l, Hits: 1})
	}
	if n := c.Len(); n > 3 {
		t.Fatalf("%d entries with MaxEntries 3", n)
	}
}

// TestErrors checks that errors of the inner limiter pass through, a
// cancelled context fails a local answer too, and nothing is cached from a
// failed call.
func TestErrors(t *testing.T) {
	clock := limitertest.NewClock(time.UnixMilli(start))
	c := newCache(t, newMemory(t, clock), clock, Options{})
	r := limiter.Request{Key: "k", Limit: limiter.Limit{Requests: 1, Window: time.Second}, Hits: 1}
	check(t, c, r)
	check(t, c, r)
	if c.Len() != 1 {
		t.Fatalf("%d entries after a denial, want 1", c.Len())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := c.Check(ctx, []limiter.Request{r}, make([]limiter.Result, 1))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cached denial with a cancelled context: %v, want context.Canceled", err)
	}
	bad := limiter.Request{Key: "", Limit: r.Limit, Hits: 1}
	if err := c.Check(context.Background(), []limiter.Request{bad}, make([]limiter.Result, 1)); !errors.Is(err, limiter.ErrInvalid) {
		t.Fatalf("empty key: %v, want ErrInvalid", err)
	}
	if err := c.Check(context.Background(), []limiter.Request{r}, nil); !errors.Is(err, limiter.ErrInvalid) {
		t.Fatalf("no results: %v, want ErrInvalid", err)
	}
}

func BenchmarkCachedDenial(b *testing.B) {
	clock := limitertest.NewClock(time.UnixMilli(start))
	c := newCache(b, newMemory(b, clock), clock, Options{MaxTTL: -1})
	benchDenial(b, c, limiter.Request{Key: "hot", Limit: limiter.Limit{Requests: 1, Window: time.Hour}, Hits: 1})
}

// BenchmarkCachedDenialKeyLength is BenchmarkCachedDenial with keys of
// several lengths: 64 bytes, one value of the longest kept as such, five.
func BenchmarkCachedDenialKeyLength(b *testing.B) {
	for _, n := range []int{64, 1024, 5000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			clock := limitertest.NewClock(time.UnixMilli(start))
			c := newCache(b, denyAll{}, clock, Options{MaxTTL: -1})
			benchDenial(b, c, limiter.Request{Key: strings.Repeat("k", n), Limit: limiter.Limit{Requests: 1, Window: time.Hour}, Hits: 1})
		})
	}
}

// benchDenial measures Checks of r, denied by the store behind c, answered
// by c.
func benchDenial(b *testing.B, c *Cache, r limiter.Request) {
	reqs := []limiter.Request{r}
	res := make([]limiter.Result, 1)
	ctx := context.Background()
	for range 2 {
		_ = c.Check(ctx, reqs, res)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Check(ctx, reqs, res); err != nil || res[0].Allowed {
			b.Fatal(err, res[0])
		}
	}
	if c.Stats().Answered < uint64(b.N) {
		b.Fatalf("only %d of %d answered locally", c.Stats().Answered, b.N)
	}
}
