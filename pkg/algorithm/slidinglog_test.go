package algorithm

import (
	"math/rand/v2"
	"testing"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// probe is what a state answers at a few instants after now, without
// consuming, and to a request of the whole limit at now (a denial's search
// over the whole log): enough to tell two sliding logs apart.
func probe(a SlidingLog, s SlidingLogState, now int64) [5]Decision {
	var out [5]Decision
	for i, dt := range []int64{0, 1, a.Window / 2, a.Window - 1} {
		out[i], _ = a.Decide(s, now+dt, 0)
	}
	out[4], _ = a.Decide(s, now, a.Limit)
	return out
}

// sameArray reports whether a and b are views of one array.
func sameArray(a, b []batch) bool {
	return cap(a) > 0 && cap(b) > 0 && &a[:cap(a)][cap(a)-1] == &b[:cap(b)][cap(b)-1]
}

// TestSlidingLogStatesStayValid keeps every state of a replay and decides
// again, consuming, on older ones (each such decision forks the shared
// log). It also keeps, of an owner's replay (Reserve and DecideOwned), the
// states Decide returns from the owner's, with and without consuming,
// before the owner goes on. Every kept state must answer afterwards
// exactly as it did when it was made: Decide never writes into memory
// another state sees, and DecideOwned writes only after its state's
// batches.
func TestSlidingLogStatesStayValid(t *testing.T) {
	type kept struct {
		s     SlidingLogState
		now   int64
		probe [5]Decision
	}
	for seed := range uint64(100) {
		rng := rand.New(rand.NewPCG(seed, 7))
		l := randomLimit(rng, limiter.SlidingLog)
		a := SlidingLog{Limit: l.Requests, Window: l.Window.Milliseconds()}
		nows, hits := traffic(rng, l, 300)
		var states []kept
		var s, owned SlidingLogState
		forks := 0
		for i, now := range nows {
			d, ns := a.Decide(s, now, hits[i])
			if d.Allowed && hits[i] > 0 {
				s = ns
			}
			states = append(states, kept{s, now, probe(a, s, now)})
			// Consume on a random earlier state: a fork of the shared log.
			j := rng.IntN(len(states))
			if d, _ := a.Decide(states[j].s, states[j].now, 1); d.Allowed {
				forks++
			}
			// Fork the owner's state, and view it, before the owner appends.
			owned, _ = owned.reserved(1)
			if d, f := a.Decide(owned, now, 1); d.Allowed {
				states = append(states, kept{f, now, probe(a, f, now)})
				forks++
			}
			_, v := a.Decide(owned, now, 0)
			states = append(states, kept{v, now, probe(a, v, now)})
			if d, no := a.decide(owned, now, hits[i], true); d.Allowed && hits[i] > 0 {
				owned = no
			}
		}
		for j, k := range states {
			if got := probe(a, k.s, k.now); got != k.probe {
				t.Fatalf("seed %d, state %d changed after later decisions:\nnow  %+v\nthen %+v", seed, j, got, k.probe)
			}
		}
		if forks == 0 {
			t.Fatalf("seed %d: no consuming decision on an earlier state", seed)
		}
	}
}

// TestSlidingLogOwnedMatchesDecide replays traffic as a store does: it
// reserves room on the state it holds, decides with DecideOwned, and keeps
// the new state or drops it and goes on from the (reserved) one before (a
// batch that another limit vetoed). Every decision must equal Decide's on a
// log built by Decide alone; an append after Reserve never copies; and the
// array stays within 4x the batches of the view, +5.
func TestSlidingLogOwnedMatchesDecide(t *testing.T) {
	copies := 0
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 11))
		l := randomLimit(rng, limiter.SlidingLog)
		a := SlidingLog{Limit: l.Requests, Window: l.Window.Milliseconds()}
		nows, hits := traffic(rng, l, 600)
		var pure, owned SlidingLogState
		for i := range nows {
			var copied bool
			if owned, copied = owned.reserved(1); copied {
				copies++
			}
			if live := len(owned.b) - owned.lo; cap(owned.b) > 4*live+5 {
				t.Fatalf("seed %d, event %d: array of capacity %d for %d batches", seed, i, cap(owned.b), live)
			}
			dp, np := a.Decide(pure, nows[i], hits[i])
			do, no := a.decide(owned, nows[i], hits[i], true)
			if dp != do {
				t.Fatalf("seed %d, event %d at %d hits %d: DecideOwned %+v, Decide %+v", seed, i, nows[i], hits[i], do, dp)
			}
			if dp.Allowed && hits[i] > 0 {
				if len(owned.b) > 0 && !sameArray(owned.b, no.b) {
					t.Fatalf("seed %d, event %d: an append after Reserve copied the log", seed, i)
				}
				if rng.IntN(4) > 0 {
					pure, owned = np, no
				}
			}
			if got, want := probe(a, owned, nows[i]), probe(a, pure, nows[i]); got != want {
				t.Fatalf("seed %d, event %d: owned log answers %+v, copied log %+v", seed, i, got, want)
			}
		}
	}
	if copies == 0 {
		t.Fatal("Reserve never copied: the traffic does not exercise growth or compaction")
	}
}

// TestSlidingLogOwnedAppendsInPlace: a store's admissions on a long log
// allocate nothing but the array's doubling, whether it keeps them or
// drops them (a veto), and in a long run of dropped ones.
func TestSlidingLogOwnedAppendsInPlace(t *testing.T) {
	a := SlidingLog{Limit: 10000, Window: 10000}
	var s SlidingLogState
	now := int64(base)
	for range 5000 {
		s, _ = s.reserved(1)
		_, s = a.decide(s, now, 1, true)
		now++
	}
	admit := func() SlidingLogState {
		s, _ = s.reserved(1)
		d, ns := a.decide(s, now, 1, true)
		if !d.Allowed {
			t.Fatal("denied")
		}
		return ns
	}
	allocs := testing.AllocsPerRun(1000, func() {
		admit() // dropped
		s = admit()
		now++
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per admission on a log of 5,000 batches, want 0 (amortised)", allocs)
	}
	if d, _ := a.Decide(s, now, 0); d.Remaining != a.Limit-s.hits() || s.hits() != 5000+1001 {
		t.Fatalf("log of %d hits, remaining %d", s.hits(), d.Remaining)
	}
	// Dropped only, for longer than the window: the batches age out of
	// the (untrimmed) view of the log the store keeps, which keeps its room.
	allocs = testing.AllocsPerRun(12000, func() {
		admit()
		now++
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per dropped admission, want 0 (amortised)", allocs)
	}
	// Dropped only, from a full array: Reserve grows it once.
	for len(s.b) < cap(s.b) {
		s = admit()
		now++
	}
	allocs = testing.AllocsPerRun(1000, func() { admit() })
	if allocs != 0 {
		t.Fatalf("%v allocations per dropped admission on a full array, want 0 (amortised)", allocs)
	}
}

// TestSlidingLogRenumbers: an owned log whose running totals would pass
// 2^62 is copied, numbered from 0, and decides as before.
func TestSlidingLogRenumbers(t *testing.T) {
	const c = 3 << 58
	a := SlidingLog{Limit: 4 * c, Window: 1000} // below 2^62
	var pure, owned SlidingLogState
	now := int64(base)
	renumbered := 0
	for i := range 200 {
		owned, _ = owned.reserved(1)
		dp, np := a.Decide(pure, now, c)
		do, no := a.decide(owned, now, c, true)
		if dp != do || !do.Allowed {
			t.Fatalf("append %d: DecideOwned %+v, Decide %+v", i, do, dp)
		}
		if len(owned.b) > 0 && !sameArray(owned.b, no.b) {
			renumbered++ // room was reserved: copied for the totals
			if first := no.b[no.lo]; first.before != 0 {
				t.Fatalf("append %d: a new log starts at running total %d", i, first.before)
			}
		}
		pure, owned = np, no
		if last := owned.b[len(owned.b)-1]; last.before+last.n > renumberAbove {
			t.Fatalf("append %d: running total %d beyond %d", i, last.before+last.n, uint64(renumberAbove))
		}
		if got, want := probe(a, owned, now), probe(a, pure, now); got != want {
			t.Fatalf("append %d: owned %+v, copied %+v", i, got, want)
		}
		now += 300 // a batch leaves every ~3 appends
	}
	if renumbered == 0 {
		t.Fatal("the running totals were never renumbered")
	}
}

// TestSlidingLogHugeLimitsDoNotPanic: beyond 2^62 (outside every backend's
// range) the sums may wrap, but a decision never indexes out of the log.
func TestSlidingLogHugeLimitsDoNotPanic(t *testing.T) {
	for seed := range uint64(2000) {
		rng := rand.New(rand.NewPCG(seed, 13))
		a := SlidingLog{Limit: 1<<62 + rng.Uint64N(1<<63), Window: 1 + rng.Int64N(100)}
		var s SlidingLogState
		now := int64(base)
		for range 20 {
			now += rng.Int64N(a.Window)
			h := rng.Uint64N(a.Limit) + 1
			owned, _ := s.reserved(1)
			a.Decide(s, now, h)
			if d, ns := a.decide(owned, now, h, true); d.Allowed {
				s = ns
			}
		}
	}
}
