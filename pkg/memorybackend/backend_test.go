package memorybackend

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
)

func check(t *testing.T, b *Backend, reqs ...limiter.Request) []limiter.Result {
	t.Helper()
	res := make([]limiter.Result, len(reqs))
	if err := b.Check(context.Background(), reqs, res); err != nil {
		t.Fatalf("Check: %v", err)
	}
	return res
}

// rawLen counts stored entries, expired or not.
func (b *Backend) rawLen() int {
	n := 0
	for i := range b.shards {
		b.shards[i].mu.Lock()
		n += len(b.shards[i].m)
		b.shards[i].mu.Unlock()
	}
	return n
}

func TestExpiryAndSweep(t *testing.T) {
	clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
	b := New(Options{Now: clock.Now, SweepInterval: -1})
	defer b.Close()
	algs := []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog}
	for i, alg := range algs {
		l := limiter.Limit{Algorithm: alg, Requests: 5, Window: time.Second}
		check(t, b, limiter.Request{Key: fmt.Sprint("k", i), Limit: l, Hits: 1})
		check(t, b, limiter.Request{Key: fmt.Sprint("check-only", i), Limit: l, Hits: 0})
	}
	if n := b.Len(); n != len(algs) {
		t.Fatalf("Len = %d after one consuming and one check-only request per algorithm, want %d", n, len(algs))
	}
	// One window later only the sliding window's counter can still matter
	// (the previous bucket weighs in during the next one).
	clock.Advance(time.Second)
	if n := b.Len(); n != 1 {
		t.Fatalf("Len = %d one window later, want 1 (sliding window)", n)
	}
	if n := b.sweep(clock.Millis()); n != 3 || b.rawLen() != 1 {
		t.Fatalf("sweep deleted %d, %d left; want 3 and 1", n, b.rawLen())
	}
	clock.Advance(time.Second)
	if n := b.sweep(clock.Millis()); n != 1 || b.Len() != 0 || b.rawLen() != 0 {
		t.Fatalf("sweep deleted %d, Len %d, stored %d; want 1, 0, 0", n, b.Len(), b.rawLen())
	}
}

func TestSweeperRunsAndCloseStopsIt(t *testing.T) {
	clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
	swept := make(chan int, 100)
	b := New(Options{Now: clock.Now, SweepInterval: time.Millisecond, afterSweep: func(n int) {
		select {
		case swept <- n:
		default:
		}
	}})
	l := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 5, Window: time.Second}
	for i := range 10 {
		check(t, b, limiter.Request{Key: fmt.Sprint(i), Limit: l, Hits: 1})
	}
	clock.Advance(time.Second)
	total := 0
	for total < 10 {
		total += <-swept
	}
	if n := b.rawLen(); n != 0 {
		t.Fatalf("%d entries left after the sweeper deleted %d", n, total)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	select {
	case <-b.done:
	default:
		t.Fatal("sweeper still running after Close")
	}
	// Check keeps working after Close.
	if res := check(t, b, limiter.Request{Key: "after", Limit: l, Hits: 1}); !res[0].Allowed {
		t.Fatal("Check after Close denied")
	}
}

// TestLargeBatch covers batches beyond the allocation-free size.
func TestLargeBatch(t *testing.T) {
	clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
	b := New(Options{Now: clock.Now, Shards: 3})
	defer b.Close()
	l := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 2, Window: time.Second}
	reqs := make([]limiter.Request, 3*smallBatch)
	for i := range reqs {
		reqs[i] = limiter.Request{Key: fmt.Sprint(i % (2 * smallBatch)), Limit: l, Hits: 1}
	}
	// Keys 0..7 appear at i and i+16, keys 8..15 once.
	twice := func(i int) bool { return i%(2*smallBatch) < smallBatch }
	for i, r := range check(t, b, reqs...) {
		want := uint64(1) // after its own consumption
		if i >= 2*smallBatch {
			want = 0
		}
		if !r.Allowed || r.Remaining != want {
			t.Fatalf("request %d: %+v, want allowed with %d remaining", i, r, want)
		}
	}
	// Keys 0..7 are full: the batch is denied and nothing is consumed.
	for i, r := range check(t, b, reqs...) {
		want := uint64(1)
		if twice(i) {
			want = 0
		}
		if r.Allowed == twice(i) || r.Remaining != want {
			t.Fatalf("second batch, request %d: %+v, want allowed=%v remaining %d", i, r, !twice(i), want)
		}
	}
}

// TestCrossShardBatchesDoNotDeadlock sends batches over the same keys in
// opposite orders from many goroutines; the model admits exactly L
// batches per key pair at a fixed instant.
func TestCrossShardBatchesDoNotDeadlock(t *testing.T) {
	clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
	b := New(Options{Now: clock.Now, Shards: 8})
	defer b.Close()
	const limit = 200
	l := limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: limit, Window: time.Minute}
	keys := []string{"a", "b", "c", "d", "e"}
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]limiter.Request, len(keys))
			for i := range keys {
				k := keys[i]
				if g%2 == 1 {
					k = keys[len(keys)-1-i]
				}
				reqs[i] = limiter.Request{Key: k, Limit: l, Hits: 1}
			}
			res := make([]limiter.Result, len(reqs))
			for range 20 {
				if err := b.Check(context.Background(), reqs, res); err != nil {
					t.Error(err)
					return
				}
				if res[0].Allowed && res[len(res)-1].Allowed {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if admitted != limit {
		t.Fatalf("%d batches admitted, want exactly %d", admitted, limit)
	}
	for _, r := range check(t, b, limiter.Request{Key: "a", Limit: l}, limiter.Request{Key: "e", Limit: l}) {
		if r.Allowed || r.Remaining != 0 {
			t.Fatalf("after the storm: %+v, want full", r)
		}
	}
}

func benchmarkCheck(b *testing.B, n int, alg limiter.Algorithm) {
	be := New(Options{})
	defer be.Close()
	l := limiter.Limit{Algorithm: alg, Requests: 1 << 40, Window: time.Hour}
	if alg == limiter.SlidingLog {
		l.Requests = 10000
		l.Window = 10 * time.Millisecond
	}
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("domain/rule/%d", i)
	}
	reqs := make([]limiter.Request, n)
	res := make([]limiter.Result, n)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		for j := range reqs {
			reqs[j] = limiter.Request{Key: keys[(i+j*7)%len(keys)], Limit: l, Hits: 1}
		}
		i++
		if err := be.Check(ctx, reqs, res); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCheck1(b *testing.B) {
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog} {
		b.Run(alg.String(), func(b *testing.B) { benchmarkCheck(b, 1, alg) })
	}
}

func BenchmarkCheck3(b *testing.B) {
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog} {
		b.Run(alg.String(), func(b *testing.B) { benchmarkCheck(b, 3, alg) })
	}
}

// BenchmarkCheck3Parallel runs 3-request batches from GOMAXPROCS goroutines.
func BenchmarkCheck3Parallel(b *testing.B) {
	be := New(Options{})
	defer be.Close()
	l := limiter.Limit{Requests: 1 << 40, Window: time.Hour}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		reqs := []limiter.Request{{Key: "a", Limit: l, Hits: 1}, {Key: "b", Limit: l, Hits: 1}, {Key: "c", Limit: l, Hits: 1}}
		res := make([]limiter.Result, 3)
		for pb.Next() {
			if err := be.Check(context.Background(), reqs, res); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// fullLog returns a backend whose key "log" holds a sliding log of 10,000
// requests in 10 s, one request a millisecond: full, so that
// from then on each request a millisecond later is admitted as the oldest
// leaves. The clock stands at the last request.
func fullLog(tb testing.TB) (*Backend, *limitertest.Clock, []limiter.Request) {
	clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
	b := New(Options{Now: clock.Now, SweepInterval: -1})
	tb.Cleanup(func() { b.Close() })
	reqs := []limiter.Request{{Key: "log", Limit: limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 10000, Window: 10 * time.Second}, Hits: 1}}
	res := make([]limiter.Result, 1)
	for i := range 10000 {
		if i > 0 {
			clock.Advance(time.Millisecond)
		}
		if err := b.Check(context.Background(), reqs, res); err != nil || !res[0].Allowed {
			tb.Fatalf("filling request %d: %+v, %v", i, res[0], err)
		}
	}
	return b, clock, reqs
}

// TestSlidingLogAppendsInPlace: on a full log of 10,000 requests, an
// admission allocates nothing but the log's doubling now and then, after
// a batch that another limit vetoed too (the log's owner writes over the
// vetoed request's batch), and so does a long run of vetoed batches.
// Copying the log, as Decide does, would allocate 240 KB per admission.
func TestSlidingLogAppendsInPlace(t *testing.T) {
	b, clock, reqs := fullLog(t)
	deny := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1, Window: time.Hour}
	check(t, b, limiter.Request{Key: "deny", Limit: deny, Hits: 1})
	vetoed := []limiter.Request{reqs[0], {Key: "deny", Limit: deny, Hits: 1}}
	res := make([]limiter.Result, 2)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		clock.Advance(time.Millisecond)
		if err := b.Check(ctx, vetoed, res); err != nil || !res[0].Allowed || res[1].Allowed {
			t.Fatalf("vetoed batch: %+v, %v", res, err)
		}
		if err := b.Check(ctx, reqs, res[:1]); err != nil || !res[0].Allowed || res[0].Remaining != 0 {
			t.Fatalf("admission: %+v, %v", res[0], err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per admission on a full sliding log, want 0 (amortised)", allocs)
	}
	// Vetoed only, for longer than the window: the stored log keeps the
	// room Reserve made, and its batches age out of the window.
	allocs = testing.AllocsPerRun(12000, func() {
		clock.Advance(time.Millisecond)
		if err := b.Check(ctx, vetoed, res); err != nil || !res[0].Allowed || res[1].Allowed {
			t.Fatalf("vetoed batch: %+v, %v", res, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per vetoed batch, want 0 (amortised)", allocs)
	}
}

// BenchmarkSlidingLogFull is a request on a full sliding log of 10,000
// requests: admitted a millisecond later (one leaves, one is logged), or
// denied at the same instant (its Retry-After searched for).
func BenchmarkSlidingLogFull(b *testing.B) {
	for _, admitted := range []bool{true, false} {
		name := "admitted"
		if !admitted {
			name = "denied"
		}
		b.Run(name, func(b *testing.B) {
			be, clock, reqs := fullLog(b)
			res := make([]limiter.Result, 1)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if admitted {
					clock.Advance(time.Millisecond)
				}
				if err := be.Check(ctx, reqs, res); err != nil || res[0].Allowed != admitted {
					b.Fatalf("%+v, %v", res[0], err)
				}
			}
		})
	}
}

// TestSlidingLogVetoesKeepRoom: a sliding log that grows one admission at
// a time, with vetoed batches in between, allocates at its doublings only.
// A vetoed batch on a full log gets its room from algorithm.Reserve, and
// the backend keeps that copy although the batch consumed nothing: were it
// dropped, every vetoed batch on a full log would copy the log again.
func TestSlidingLogVetoesKeepRoom(t *testing.T) {
	clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
	b := New(Options{Now: clock.Now, SweepInterval: -1})
	defer b.Close()
	log := limiter.Request{Key: "log", Limit: limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 10000, Window: time.Hour}, Hits: 1}
	deny := limiter.Request{Key: "deny", Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1, Window: 24 * time.Hour}, Hits: 1}
	check(t, b, deny)
	ctx := context.Background()
	res := make([]limiter.Result, 2)
	const admissions, vetoes = 1000, 8
	allocs := testing.AllocsPerRun(1, func() {
		for range admissions {
			clock.Advance(time.Millisecond)
			if err := b.Check(ctx, []limiter.Request{log}, res[:1]); err != nil || !res[0].Allowed {
				t.Fatalf("admission: %+v, %v", res[0], err)
			}
			for range vetoes {
				if err := b.Check(ctx, []limiter.Request{log, deny}, res); err != nil || !res[0].Allowed || res[1].Allowed {
					t.Fatalf("vetoed batch: %+v, %v", res, err)
				}
			}
		}
	})
	// AllocsPerRun runs the loop twice and counts the second: the log
	// grows from 1,000 to 2,000 batches, one or two doublings. A copy per
	// vetoed batch on a full log would add vetoes at each.
	if allocs > 2 {
		t.Fatalf("%v allocations for %d admissions and %d vetoed batches, want one per doubling", allocs, admissions, admissions*vetoes)
	}
}
