package algorithm

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// event is one decision of a replay.
type event struct {
	now  int64
	hits uint64
	d    Decision
	pre  State // the state the decision was made on
}

// traffic returns n random (now, hits) pairs with non-decreasing now:
// bursts at one instant, small steps, steps around the window, long gaps;
// hits mostly 1, sometimes 0, sometimes up to capacity+1.
func traffic(rng *rand.Rand, l limiter.Limit, n int) (nows []int64, hits []uint64) {
	w := l.Window.Milliseconds()
	capy := l.Capacity()
	now := base + rng.Int64N(w)
	for range n {
		switch p := rng.IntN(20); {
		case p < 8: // same instant
		case p < 14:
			now += 1 + rng.Int64N(max(w/int64(capy), 1)*2)
		case p < 17:
			now += rng.Int64N(w + 1)
		case p < 19:
			now += w - 1 + rng.Int64N(3)
		default:
			now += rng.Int64N(3 * w)
		}
		var h uint64 = 1
		switch p := rng.IntN(20); {
		case p == 0:
			h = 0
		case p == 1:
			h = capy + 1
		case p < 5:
			h = 1 + rng.Uint64N(capy)
		}
		nows, hits = append(nows, now), append(hits, h)
	}
	return nows, hits
}

func replay(l limiter.Limit, nows []int64, hits []uint64) []event {
	var s State
	evs := make([]event, len(nows))
	for i := range nows {
		d, ns := Decide(l, s, nows[i], hits[i])
		evs[i] = event{now: nows[i], hits: hits[i], d: d, pre: s}
		if d.Allowed && hits[i] > 0 {
			s = ns
		}
	}
	return evs
}

// randomLimit returns a limit of alg with small numbers, so that windows
// are crossed often.
func randomLimit(rng *rand.Rand, alg limiter.Algorithm) limiter.Limit {
	ws := []int64{1, 2, 3, 7, 10, 60, 100, 1000, 1500, 60000}
	l := limiter.Limit{Algorithm: alg, Requests: 1 + rng.Uint64N(12), Window: time.Duration(ws[rng.IntN(len(ws))]) * time.Millisecond}
	if alg == limiter.TokenBucket && rng.IntN(2) == 0 {
		l.Burst = 1 + rng.Uint64N(20)
	}
	return l
}

const seeds = 300

// forSeeds runs f for many seeded random limits and traffic of alg.
func forSeeds(t *testing.T, alg limiter.Algorithm, f func(t *testing.T, l limiter.Limit, evs []event)) {
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, uint64(alg)))
		l := randomLimit(rng, alg)
		nows, hits := traffic(rng, l, 400)
		evs := replay(l, nows, hits)
		f(t, l, evs)
		if t.Failed() {
			t.Fatalf("seed %d, limit %+v", seed, l)
		}
	}
}

// admitted lists the (time, hits) of consumed decisions.
func admitted(evs []event) (ts []int64, cs []uint64) {
	for _, e := range evs {
		if e.d.Allowed && e.hits > 0 {
			ts, cs = append(ts, e.now), append(cs, e.hits)
		}
	}
	return ts, cs
}

// maxInWindow returns the most hits admitted in any half-open interval
// (t−w, t] (the maximum is reached with t at an admitted hit).
func maxInWindow(ts []int64, cs []uint64, w int64) uint64 {
	var best uint64
	for j := range ts {
		var n uint64
		for i := j; i >= 0 && ts[i] > ts[j]-w; i-- {
			n += cs[i]
		}
		best = max(best, n)
	}
	return best
}

func TestSlidingLogMatchesExactModel(t *testing.T) {
	forSeeds(t, limiter.SlidingLog, func(t *testing.T, l limiter.Limit, evs []event) {
		w := l.Window.Milliseconds()
		var logT []int64 // every admitted hit, one entry per hit
		for i, e := range evs {
			c := max(e.hits, 1)
			n := uint64(0)
			for _, x := range logT {
				if x > e.now-w {
					n++
				}
			}
			allow := c <= l.Requests && n+c <= l.Requests
			if e.d.Allowed != allow {
				t.Fatalf("event %d at %d hits %d: Allowed %v, exact model %v (%d in window)", i, e.now, e.hits, e.d.Allowed, allow, n)
			}
			if allow && e.hits > 0 {
				for range c {
					logT = append(logT, e.now)
				}
				n += c
			}
			if want := l.Requests - min(n, l.Requests); e.d.Remaining != want {
				t.Fatalf("event %d: Remaining %d, model %d", i, e.d.Remaining, want)
			}
		}
		ts, cs := admitted(evs)
		if got := maxInWindow(ts, cs, w); got > l.Requests {
			t.Fatalf("%d hits admitted within %dms, limit %d", got, w, l.Requests)
		}
	})
}

func TestFixedWindowMatchesModel(t *testing.T) {
	forSeeds(t, limiter.FixedWindow, func(t *testing.T, l limiter.Limit, evs []event) {
		w := l.Window.Milliseconds()
		count := map[int64]uint64{}
		for i, e := range evs {
			c := max(e.hits, 1)
			b := e.now / w
			allow := c <= l.Requests && count[b]+c <= l.Requests
			if e.d.Allowed != allow {
				t.Fatalf("event %d: Allowed %v, model %v", i, e.d.Allowed, allow)
			}
			if allow && e.hits > 0 {
				count[b] += c
			}
			if e.d.Remaining != l.Requests-count[b] || e.d.ResetAfter != time.Duration((b+1)*w-e.now)*time.Millisecond {
				t.Fatalf("event %d: %+v, model Remaining %d", i, e.d, l.Requests-count[b])
			}
		}
	})
}

// TestTokenBucketMatchesContinuousBucket compares GCRA with a token bucket
// that refills continuously: its level is counted in units of 1/W hit, so
// it holds at most Burst·W units and gains Limit units per ms.
func TestTokenBucketMatchesContinuousBucket(t *testing.T) {
	forSeeds(t, limiter.TokenBucket, func(t *testing.T, l limiter.Limit, evs []event) {
		w := uint64(l.Window.Milliseconds())
		b := l.Capacity()
		level, last := b*w, evs[0].now
		for i, e := range evs {
			level = min(b*w, level+uint64(e.now-last)*l.Requests)
			last = e.now
			c := max(e.hits, 1)
			allow := c <= b && level >= c*w
			if e.d.Allowed != allow {
				t.Fatalf("event %d at %d hits %d: Allowed %v, bucket %v (level %d/%d)", i, e.now, e.hits, e.d.Allowed, allow, level, w)
			}
			if allow && e.hits > 0 {
				level -= c * w
			}
			if want := level / w; e.d.Remaining != want {
				t.Fatalf("event %d: Remaining %d, bucket %d", i, e.d.Remaining, want)
			}
			// Until full: (Burst·W − level) units at Limit units per ms.
			full := (b*w - level + l.Requests - 1) / l.Requests
			if e.d.ResetAfter != time.Duration(full)*time.Millisecond {
				t.Fatalf("event %d: ResetAfter %v, bucket full in %dms", i, e.d.ResetAfter, full)
			}
		}
		// GCRA conformance: in any [t_i, t_j], at most Burst + (t_j−t_i)/T.
		ts, cs := admitted(evs)
		for i := range ts {
			var sum uint64
			for j := i; j < len(ts); j++ {
				sum += cs[j]
				if sum*w > b*w+uint64(ts[j]-ts[i])*l.Requests {
					t.Fatalf("%d hits in [%d, %d]: more than %d + %dms at %d per %dms", sum, ts[i], ts[j], b, ts[j]-ts[i], l.Requests, w)
				}
			}
		}
	})
}

// slidingWindowBound is the most hits SlidingWindow admits in any
// half-open interval of length W (see SlidingWindow).
func slidingWindowBound(l, w uint64) uint64 {
	if w == 1 {
		return l
	}
	return 2*l - (2*l+w-1)/w
}

func TestSlidingWindowMatchesModelAndBound(t *testing.T) {
	forSeeds(t, limiter.SlidingWindow, func(t *testing.T, l limiter.Limit, evs []event) {
		w := l.Window.Milliseconds()
		count := map[int64]uint64{}
		for i, e := range evs {
			c := max(e.hits, 1)
			b := e.now / w
			elapsed := e.now - b*w
			prev := count[b-1]
			pw := (prev*uint64(w-elapsed) + uint64(w) - 1) / uint64(w) // exact integer ceil
			allow := c <= l.Requests && count[b]+pw+c <= l.Requests
			if e.d.Allowed != allow {
				t.Fatalf("event %d: Allowed %v, model %v", i, e.d.Allowed, allow)
			}
			if allow && e.hits > 0 {
				count[b] += c
			}
		}
		for b, n := range count {
			if n > l.Requests {
				t.Fatalf("bucket %d admitted %d > %d", b, n, l.Requests)
			}
		}
		ts, cs := admitted(evs)
		if got, bound := maxInWindow(ts, cs, w), slidingWindowBound(l.Requests, uint64(w)); got > bound {
			t.Fatalf("%d hits within %dms, documented bound %d", got, w, bound)
		}
	})
}

// TestSlidingWindowBoundIsAttained replays the worst case of the
// documented bound: Limit hits at the last ms of a bucket, then as many as
// admitted two ms before the end of the next.
func TestSlidingWindowBoundIsAttained(t *testing.T) {
	for _, c := range []struct{ l, w uint64 }{{10, 1000}, {1000, 1000}, {5, 3}, {7, 2}, {100, 60000}, {3000, 1000}} {
		l := limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: c.l, Window: time.Duration(c.w) * time.Millisecond}
		w := int64(c.w)
		var s State
		var ts []int64
		var cs []uint64
		for _, now := range []int64{base + w - 1, base + 2*w - 2} {
			for {
				d, ns := Decide(l, s, now, 1)
				if !d.Allowed {
					break
				}
				s = ns
				ts, cs = append(ts, now), append(cs, 1)
			}
		}
		if got, bound := maxInWindow(ts, cs, w), slidingWindowBound(c.l, c.w); got != bound {
			t.Errorf("L=%d W=%d: worst case admitted %d in a window, documented bound %d", c.l, c.w, got, bound)
		}
	}
}

// TestRetryAfterExact checks, for every denial of random traffic, that the
// same hits on the same state are denied at every instant before
// now+RetryAfter (all of them for small windows, else the last one) and
// admitted at now+RetryAfter.
func TestRetryAfterExact(t *testing.T) {
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			denials := 0
			forSeeds(t, alg, func(t *testing.T, l limiter.Limit, evs []event) {
				for i, e := range evs {
					c := max(e.hits, 1)
					if e.d.Allowed || c > l.Capacity() {
						continue
					}
					denials++
					d := e.d.RetryAfter.Milliseconds()
					if d < 1 || e.d.RetryAfter%time.Millisecond != 0 {
						t.Fatalf("event %d: RetryAfter %v", i, e.d.RetryAfter)
					}
					from := e.now + d - 1
					if d <= 50 {
						from = e.now + 1
					}
					for at := from; at < e.now+d; at++ {
						if r, _ := Decide(l, e.pre, at, c); r.Allowed {
							t.Fatalf("event %d at %d: RetryAfter %dms but %d hits admitted %dms later", i, e.now, d, c, at-e.now)
						}
					}
					if r, _ := Decide(l, e.pre, e.now+d, c); !r.Allowed {
						t.Fatalf("event %d at %d: %d hits still denied after RetryAfter %dms: %+v", i, e.now, c, d, r)
					}
				}
			})
			if denials < seeds {
				t.Fatalf("only %d denials: the traffic does not exercise RetryAfter", denials)
			}
		})
	}
}

// TestZeroHitsAndOverCapacity checks for every algorithm that hits 0 decides
// as one hit without consuming, and that more than the capacity is denied
// with RetryAfter = W without consuming.
func TestZeroHitsAndOverCapacity(t *testing.T) {
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog} {
		forSeeds(t, alg, func(t *testing.T, l limiter.Limit, evs []event) {
			for i, e := range evs {
				zero, s0 := Decide(l, e.pre, e.now, 0)
				one, _ := Decide(l, e.pre, e.now, 1)
				cur, _ := Decide(l, e.pre, e.now, 0)
				if zero.Allowed != one.Allowed || zero.RetryAfter != one.RetryAfter || zero != cur {
					t.Fatalf("event %d: hits 0 %+v, hits 1 %+v", i, zero, one)
				}
				over, s1 := Decide(l, e.pre, e.now, l.Capacity()+1)
				if over.Allowed || over.RetryAfter != l.Window || over.Remaining != zero.Remaining || over.ResetAfter != zero.ResetAfter {
					t.Fatalf("event %d: over capacity %+v (hits 0: %+v)", i, over, zero)
				}
				// Neither consumed: the next decision is the same on either state.
				at := e.now + 1
				a, _ := Decide(l, s0, at, 1)
				b, _ := Decide(l, s1, at, 1)
				p, _ := Decide(l, e.pre, at, 1)
				if a != p || b != p {
					t.Fatalf("event %d: after hits 0 %+v, after over capacity %+v, untouched %+v", i, a, b, p)
				}
			}
		})
	}
}

// TestBoundaryBurst: L hits just before a window edge and L just after all
// pass a fixed window, but not a sliding window.
func TestBoundaryBurst(t *testing.T) {
	for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindow} {
		l := limiter.Limit{Algorithm: alg, Requests: 10, Window: time.Second}
		edge := int64(base + 5000)
		var s State
		passed := 0
		for _, now := range []int64{edge - 1, edge} {
			for range l.Requests {
				d, ns := Decide(l, s, now, 1)
				if d.Allowed {
					passed++
					s = ns
				}
			}
		}
		switch alg {
		case limiter.FixedWindow:
			if passed != 20 {
				t.Errorf("fixed window: %d of 20 passed around the edge, want all", passed)
			}
		default:
			if passed >= 20 || passed < 10 {
				t.Errorf("sliding window: %d of 20 passed around the edge, want at least 10 and not all", passed)
			}
		}
	}
}

// TestTokenBucketFullBurstAtRealClock: an empty bucket admits exactly its
// burst at one instant, for any rate (the float64 formula of the first
// design refused it in about a quarter of cases).
func TestTokenBucketFullBurstAtRealClock(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for range 1000 {
		l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1 + rng.Uint64N(1000), Burst: 1 + rng.Uint64N(1000),
			Window: time.Duration(1+rng.Int64N(3_600_000)) * time.Millisecond}
		now := base + rng.Int64N(1e11)
		d, s := Decide(l, State{}, now, l.Burst)
		if !d.Allowed {
			t.Fatalf("%+v at %d: full burst refused: %+v", l, now, d)
		}
		if d, _ := Decide(l, s, now, 1); d.Allowed {
			t.Fatalf("%+v at %d: one more than the burst admitted", l, now)
		}
		// One by one: exactly Burst.
		s, n := State{}, uint64(0)
		for {
			d, ns := Decide(l, s, now, 1)
			if !d.Allowed {
				break
			}
			s, n = ns, n+1
		}
		if n != l.Burst {
			t.Fatalf("%+v: %d single hits admitted at one instant, want %d", l, n, l.Burst)
		}
	}
}

// TestExpiresAt checks that a state is equivalent to the zero State from
// its expiry on, and not one ms earlier if it held anything.
func TestExpiresAt(t *testing.T) {
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog} {
		forSeeds(t, alg, func(t *testing.T, l limiter.Limit, evs []event) {
			for i, e := range evs {
				_, s := Decide(l, e.pre, e.now, e.hits)
				exp := ExpiresAt(l, s)
				if exp < e.now {
					continue
				}
				for _, at := range []int64{exp, exp + 1, exp + l.Window.Milliseconds()} {
					got, _ := Decide(l, s, at, 0)
					want, _ := Decide(l, State{}, at, 0)
					if got != want {
						t.Fatalf("event %d: state %+v expires at %d, but at %d decides %+v, empty %+v", i, s, exp, at, got, want)
					}
				}
			}
		})
	}
}

func Example() {
	l := limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 2, Window: time.Second}
	var s State
	for _, now := range []int64{0, 10, 20, 1500} {
		var d Decision
		d, s = Decide(l, s, base+now, 1)
		fmt.Printf("t=%4dms allowed=%v remaining=%d retry=%v\n", now, d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// t=   0ms allowed=true remaining=1 retry=0s
	// t=  10ms allowed=true remaining=0 retry=0s
	// t=  20ms allowed=false remaining=0 retry=1.48s
	// t=1500ms allowed=true remaining=0 retry=0s
}
