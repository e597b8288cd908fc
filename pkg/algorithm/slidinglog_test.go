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

// TestSlidingLogStatesStayValid keeps every state of a replay and decides
// again, consuming, on older ones (each such decision forks the shared log),
// and on the states of an owner's replay (DecideOwned) before the owner goes
// on. Every kept state must answer afterwards exactly as it did when it was
// made: Decide never writes into memory another state can see.
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
			// Fork the owner's state, which then appends after it.
			if d, f := a.Decide(owned, now, 1); d.Allowed {
				states = append(states, kept{f, now, probe(a, f, now)})
				forks++
			}
			if d, no := a.DecideOwned(owned, now, hits[i]); d.Allowed && hits[i] > 0 {
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

// TestSlidingLogOwnedMatchesDecide replays traffic with DecideOwned as a
// store does: it keeps the new state, or drops it and goes on from the one
// before (a batch that another limit vetoed). Every decision must equal
// Decide's on a log built by Decide alone, and the shared log's memory must
// stay within twice the most batches the window held, plus a few.
func TestSlidingLogOwnedMatchesDecide(t *testing.T) {
	compactions := 0
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 11))
		l := randomLimit(rng, limiter.SlidingLog)
		a := SlidingLog{Limit: l.Requests, Window: l.Window.Milliseconds()}
		nows, hits := traffic(rng, l, 600)
		var pure, owned SlidingLogState
		var last *hitLog
		for i := range nows {
			dp, np := a.Decide(pure, nows[i], hits[i])
			do, no := a.DecideOwned(owned, nows[i], hits[i])
			if dp != do {
				t.Fatalf("seed %d, event %d at %d hits %d: DecideOwned %+v, Decide %+v", seed, i, nows[i], hits[i], do, dp)
			}
			if dp.Allowed && hits[i] > 0 {
				// Right after an append, the log's memory is within 4×
				// its live batches (+4): it doubles as it grows, and is
				// copied once more batches left than are live.
				if live := no.hi - no.lo; cap(no.log.b) > 4*live+4 {
					t.Fatalf("seed %d, event %d: log of capacity %d for %d live batches", seed, i, cap(no.log.b), live)
				}
				if rng.IntN(4) > 0 {
					pure, owned = np, no
				}
			}
			if got, want := probe(a, owned, nows[i]), probe(a, pure, nows[i]); got != want {
				t.Fatalf("seed %d, event %d: owned log answers %+v, copied log %+v", seed, i, got, want)
			}
			if owned.log != nil {
				if last != nil && owned.log != last {
					compactions++
				}
				last = owned.log
			}
		}
	}
	if compactions == 0 {
		t.Fatal("no owned log was ever copied: the traffic does not exercise growth or compaction")
	}
}

// TestSlidingLogOwnedAppendsInPlace: a store's admissions on a long log
// allocate nothing but the log's doubling, including after batches that
// were dropped (their batches are written over).
func TestSlidingLogOwnedAppendsInPlace(t *testing.T) {
	a := SlidingLog{Limit: 10000, Window: 10000}
	var s SlidingLogState
	now := int64(base)
	for range 5000 {
		_, s = a.DecideOwned(s, now, 1)
		now++
	}
	allocs := testing.AllocsPerRun(1000, func() {
		// A dropped admission, then a kept one.
		if d, _ := a.DecideOwned(s, now, 1); !d.Allowed {
			t.Fatal("denied")
		}
		d, ns := a.DecideOwned(s, now, 1)
		if !d.Allowed {
			t.Fatal("denied")
		}
		s = ns
		now++
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per admission on a log of 5,000 batches, want 0 (amortised)", allocs)
	}
	if d, _ := a.Decide(s, now, 0); d.Remaining != a.Limit-s.hits() || s.hits() != 5000+1001 {
		t.Fatalf("log of %d hits, remaining %d", s.hits(), d.Remaining)
	}
}

// TestSlidingLogRenumbers: an owned log whose running totals would pass
// 2^62 starts a new log numbered from 0, and decides as before.
func TestSlidingLogRenumbers(t *testing.T) {
	const c = 3 << 58
	a := SlidingLog{Limit: 4 * c, Window: 1000} // below 2^62
	var pure, owned SlidingLogState
	now := int64(base)
	renumbered := 0
	for i := range 200 {
		dp, np := a.Decide(pure, now, c)
		do, no := a.DecideOwned(owned, now, c)
		if dp != do || !do.Allowed {
			t.Fatalf("append %d: DecideOwned %+v, Decide %+v", i, do, dp)
		}
		if owned.log != nil && no.log != owned.log && owned.hi < cap(owned.log.b) && owned.lo <= owned.hi-owned.lo {
			renumbered++ // room to append in place: copied for the totals
			if first := no.log.b[no.lo]; first.before != 0 {
				t.Fatalf("append %d: a new log starts at running total %d", i, first.before)
			}
		}
		pure, owned = np, no
		if last := owned.log.b[owned.hi-1]; last.before+last.n > renumberAbove {
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
