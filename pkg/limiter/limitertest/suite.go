package limitertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// Factory returns a fresh, empty Limiter whose clock is now (called as now()
// on every decision; a Redis backend passes it into its scripts instead of
// Redis TIME). It registers any cleanup with t.
type Factory func(t *testing.T, now func() time.Time) limiter.Limiter

var algorithms = []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog}

// epoch is where the suite's clocks start: midnight UTC, aligned to every
// window the suite uses, plus an odd offset.
const epoch = 1_767_225_600_000 + 137

// Run runs the conformance suite against the backend built by f, as
// subtests. Every decision is compared with the reference model
// (pkg/algorithm plus the batch semantics of the package documentation).
func Run(t *testing.T, f Factory) {
	for _, alg := range algorithms {
		t.Run("Reference/"+alg.String(), func(t *testing.T) { testReference(t, f, alg) })
		t.Run("RetryAfterExact/"+alg.String(), func(t *testing.T) { testRetryAfter(t, f, alg) })
		t.Run("ZeroHits/"+alg.String(), func(t *testing.T) { testZeroHits(t, f, alg) })
		t.Run("OverCapacity/"+alg.String(), func(t *testing.T) { testOverCapacity(t, f, alg) })
		t.Run("SameKeyTwice/"+alg.String(), func(t *testing.T) { testSameKeyTwice(t, f, alg) })
		t.Run("Shadow/"+alg.String(), func(t *testing.T) { testShadow(t, f, alg) })
		t.Run("ChangingRequests/"+alg.String(), func(t *testing.T) { testChangingRequests(t, f, alg) })
		t.Run("ClockBack/"+alg.String(), func(t *testing.T) { testClockBack(t, f, alg) })
	}
	t.Run("AllOrNothing", func(t *testing.T) { testAllOrNothing(t, f) })
	t.Run("Isolation", func(t *testing.T) { testIsolation(t, f) })
	t.Run("Invalid", func(t *testing.T) { testInvalid(t, f) })
	t.Run("CancelledContext", func(t *testing.T) { testCancelled(t, f) })
}

// harness drives a backend and the model with the same clock and batches.
type harness struct {
	t     *testing.T
	lim   limiter.Limiter
	clock *Clock
	m     *Model
	steps int
}

func newHarness(t *testing.T, f Factory) *harness {
	c := NewClock(time.UnixMilli(epoch))
	lim := f(t, c.Now)
	if lim == nil {
		t.Fatal("Factory returned nil")
	}
	return &harness{t: t, lim: lim, clock: c, m: NewModel()}
}

// key returns a key unique to the test and name.
func (h *harness) key(name string) string { return h.t.Name() + "/" + name }

// check runs reqs on the backend and the model at the clock's instant,
// reports every difference, and returns the backend's results and whether
// they matched.
func (h *harness) check(reqs ...limiter.Request) ([]limiter.Result, bool) {
	h.t.Helper()
	h.steps++
	got := make([]limiter.Result, len(reqs))
	now := h.clock.Millis()
	if err := h.lim.Check(context.Background(), reqs, got); err != nil {
		h.t.Fatalf("step %d at epoch+%dms: Check(%s): %v", h.steps, now-epoch, fmtReqs(reqs), err)
	}
	want, _ := h.m.Check(now, reqs, false)
	ok := true
	for i := range reqs {
		if got[i] != want[i] {
			ok = false
			h.t.Errorf("step %d at epoch+%dms: Check(%s)\n  result %d = %s\n  reference %s",
				h.steps, now-epoch, fmtReqs(reqs), i, fmtRes(got[i]), fmtRes(want[i]))
		}
	}
	return got, ok
}

// must is check that stops the test on a difference.
func (h *harness) must(reqs ...limiter.Request) []limiter.Result {
	h.t.Helper()
	res, ok := h.check(reqs...)
	if !ok {
		h.t.FailNow()
	}
	return res
}

func fmtReqs(reqs []limiter.Request) string {
	s := ""
	for i, r := range reqs {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("{%s %v L=%d B=%d W=%v hits=%d shadow=%v}", r.Key, r.Limit.Algorithm, r.Limit.Requests,
			r.Limit.Burst, r.Limit.Window, r.Hits, r.Shadow)
	}
	return s
}

func fmtRes(r limiter.Result) string {
	return fmt.Sprintf("{Allowed:%v Remaining:%d ResetAfter:%v RetryAfter:%v Source:%v}",
		r.Allowed, r.Remaining, r.ResetAfter, r.RetryAfter, r.Source)
}

func req(key string, l limiter.Limit, hits uint64) limiter.Request {
	return limiter.Request{Key: key, Limit: l, Hits: hits}
}

// limitsFor returns the limits the reference tests use for alg.
func limitsFor(alg limiter.Algorithm) []limiter.Limit {
	ls := []limiter.Limit{
		{Algorithm: alg, Requests: 5, Window: time.Second},
		{Algorithm: alg, Requests: 7, Window: 1500 * time.Millisecond},
		{Algorithm: alg, Requests: 3, Window: 10 * time.Millisecond},
		{Algorithm: alg, Requests: 1000, Window: time.Minute},
	}
	switch alg {
	case limiter.TokenBucket:
		ls = append(ls, limiter.Limit{Algorithm: alg, Requests: 3, Burst: 11, Window: time.Second},
			limiter.Limit{Algorithm: alg, Requests: 9, Burst: 2, Window: 700 * time.Millisecond})
	case limiter.SlidingWindow, limiter.FixedWindow:
		// Counts whose products with the window pass 2^53 (the Lua
		// scripts' exact doubles) and 2^64: 5 million a month, as an API
		// plan's quota, and 3 billion a year.
		ls = append(ls, limiter.Limit{Algorithm: alg, Requests: 5_000_000, Window: 30 * 24 * time.Hour},
			limiter.Limit{Algorithm: alg, Requests: 3_000_000_000, Window: 365 * 24 * time.Hour})
	}
	return ls
}

// testReference replays seeded random traffic (batches of one to three
// requests on two keys, hits 0..capacity+1, some shadow) at random instants
// and compares every result with the reference.
func testReference(t *testing.T, f Factory, alg limiter.Algorithm) {
	for li, l := range limitsFor(alg) {
		t.Run(fmt.Sprintf("L%d_B%d_W%v", l.Requests, l.Burst, l.Window), func(t *testing.T) {
			h := newHarness(t, f)
			rng := rand.New(rand.NewPCG(uint64(li)+1, uint64(alg)+1))
			w := l.Window.Milliseconds()
			capy := l.Capacity()
			keys := []string{h.key("a"), h.key("b")}
			steps := []int64{0, 0, 1, 1, w / 10, w / 3, w / 2, w - 1, w, w + 1, 2 * w}
			for step := 0; step < 300; step++ {
				h.clock.Advance(time.Duration(steps[rng.IntN(len(steps))]+rng.Int64N(3)) * time.Millisecond)
				n := 1 + rng.IntN(3)
				reqs := make([]limiter.Request, n)
				for i := range reqs {
					var hits uint64
					switch p := rng.IntN(10); {
					case p == 0:
						hits = 0
					case p == 1:
						hits = capy + 1
					case p <= 3:
						hits = 1 + rng.Uint64N(capy)
					default:
						hits = 1
					}
					reqs[i] = req(keys[rng.IntN(2)], l, hits)
					reqs[i].Shadow = rng.IntN(6) == 0
				}
				if _, ok := h.check(reqs...); !ok {
					return
				}
			}
		})
	}
}

// testRetryAfter checks that after a denial with RetryAfter d the same hits
// are denied at now+d−1ms and admitted at now+d.
func testRetryAfter(t *testing.T, f Factory, alg limiter.Algorithm) {
	for _, l := range limitsFor(alg) {
		t.Run(fmt.Sprintf("L%d_B%d_W%v", l.Requests, l.Burst, l.Window), func(t *testing.T) {
			h := newHarness(t, f)
			k := h.key("k")
			rng := rand.New(rand.NewPCG(l.Requests, uint64(l.Window)))
			w := l.Window.Milliseconds()
			denials := 0
			for round := 0; round < 40 && !t.Failed(); round++ {
				h.clock.Advance(time.Duration(rng.Int64N(w/2+1)) * time.Millisecond)
				hits := 1 + rng.Uint64N(min(l.Capacity(), 3))
				if rng.IntN(2) == 0 {
					hits = 1 + rng.Uint64N(l.Capacity())
				}
				res := h.must(req(k, l, hits))
				if res[0].Allowed {
					continue
				}
				denials++
				d := res[0].RetryAfter
				if d < time.Millisecond {
					t.Fatalf("denied with RetryAfter %v, want ≥ 1ms", d)
				}
				h.clock.Advance(d - time.Millisecond)
				if res := h.must(req(k, l, hits)); res[0].Allowed {
					t.Fatalf("RetryAfter %v: %d hits already admitted 1ms earlier", d, hits)
				}
				h.clock.Advance(time.Millisecond)
				if res := h.must(req(k, l, hits)); !res[0].Allowed {
					t.Fatalf("RetryAfter %v: %d hits still denied then (%s)", d, hits, fmtRes(res[0]))
				}
			}
			if denials == 0 {
				t.Fatal("the script produced no denial")
			}
		})
	}
}

// testZeroHits checks that hits 0 decides as for one hit and consumes
// nothing.
func testZeroHits(t *testing.T, f Factory, alg limiter.Algorithm) {
	h := newHarness(t, f)
	l := limiter.Limit{Algorithm: alg, Requests: 3, Window: time.Second}
	k := h.key("k")
	for range 5 {
		if res := h.must(req(k, l, 0)); !res[0].Allowed || res[0].Remaining != l.Capacity() {
			t.Fatalf("hits 0 on an empty counter: %s, want allowed with Remaining %d", fmtRes(res[0]), l.Capacity())
		}
	}
	h.must(req(k, l, l.Capacity()))
	res := h.must(req(k, l, 0))
	if res[0].Allowed || res[0].Remaining != 0 || res[0].RetryAfter <= 0 {
		t.Fatalf("hits 0 on a full counter: %s, want denied with a RetryAfter", fmtRes(res[0]))
	}
	h.clock.Advance(res[0].RetryAfter)
	h.must(req(k, l, 0))
	h.must(req(k, l, 1))
}

// testOverCapacity checks that hits above the capacity are denied with
// RetryAfter = W, consume nothing and veto the batch.
func testOverCapacity(t *testing.T, f Factory, alg limiter.Algorithm) {
	h := newHarness(t, f)
	l := limiter.Limit{Algorithm: alg, Requests: 4, Window: time.Second}
	other := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 10, Window: time.Second}
	k, o := h.key("k"), h.key("other")
	res := h.must(req(o, other, 1), req(k, l, l.Capacity()+1))
	if res[1].Allowed || res[1].RetryAfter != l.Window || !res[0].Allowed {
		t.Fatalf("over capacity: %s / %s, want other allowed and this denied with RetryAfter %v", fmtRes(res[0]), fmtRes(res[1]), l.Window)
	}
	res = h.must(req(o, other, 0), req(k, l, 0))
	if res[0].Remaining != other.Requests || res[1].Remaining != l.Capacity() {
		t.Fatalf("a batch vetoed by an over-capacity request consumed: %s / %s", fmtRes(res[0]), fmtRes(res[1]))
	}
	h.clock.Advance(l.Window)
	h.must(req(k, l, l.Capacity()+1))
	h.must(req(k, l, l.Capacity()))
}

// testClockBack checks that a clock stepping back across a window edge
// (an NTP step, a failover to a server whose clock is behind) does not make
// a counter forget what it counted: a limit filled just after the edge
// still denies just before it, and then at the edge again.
func testClockBack(t *testing.T, f Factory, alg limiter.Algorithm) {
	h := newHarness(t, f)
	l := limiter.Limit{Algorithm: alg, Requests: 3, Window: time.Second}
	k := h.key("k")
	edge := int64(epoch/1000+5) * 1000 // a window edge after the harness's start
	h.clock.SetMillis(edge + 5)
	for range l.Requests {
		if res := h.must(req(k, l, 1)); !res[0].Allowed {
			t.Fatalf("filling the limit after the edge: %s", fmtRes(res[0]))
		}
	}
	for _, at := range []int64{edge - 5, edge - 1, edge, edge + 5} {
		h.clock.SetMillis(at)
		if res := h.must(req(k, l, 1)); res[0].Allowed {
			t.Fatalf("at edge%+dms, after the limit was filled at edge+5ms: admitted %s", at-edge, fmtRes(res[0]))
		}
	}
}

// testSameKeyTwice checks that two requests on one counter in one batch
// count twice, and that a denial of the second undoes the first.
func testSameKeyTwice(t *testing.T, f Factory, alg limiter.Algorithm) {
	h := newHarness(t, f)
	l := limiter.Limit{Algorithm: alg, Requests: 3, Window: time.Second}
	k := h.key("k")
	res := h.must(req(k, l, 1), req(k, l, 1))
	if !res[0].Allowed || !res[1].Allowed || res[1].Remaining+1 != res[0].Remaining {
		t.Fatalf("same key twice: %s / %s, want both allowed and Remaining one apart", fmtRes(res[0]), fmtRes(res[1]))
	}
	res = h.must(req(k, l, 1), req(k, l, 1))
	if !res[0].Allowed || res[1].Allowed {
		t.Fatalf("same key twice on one left: %s / %s, want the first allowed and the second denied", fmtRes(res[0]), fmtRes(res[1]))
	}
	if res := h.must(req(k, l, 0)); res[0].Remaining != 1 {
		t.Fatalf("a denied batch consumed: %s", fmtRes(res[0]))
	}
	h.must(req(k, l, 1))
	h.clock.Advance(time.Millisecond)
	h.must(req(k, l, 0), req(k, l, 2), req(k, l, 0))
}

// testShadow checks that a denied shadow request neither vetoes nor
// consumes, and an admitted one consumes.
func testShadow(t *testing.T, f Factory, alg limiter.Algorithm) {
	h := newHarness(t, f)
	l := limiter.Limit{Algorithm: alg, Requests: 2, Window: time.Second}
	s, n := h.key("shadow"), h.key("normal")
	shadow := func(hits uint64) limiter.Request {
		r := req(s, l, hits)
		r.Shadow = true
		return r
	}
	h.must(shadow(1), req(n, l, 1))
	res := h.must(shadow(2), req(n, l, 1))
	if res[0].Allowed || !res[1].Allowed {
		t.Fatalf("shadow over its limit: %s / %s, want shadow denied, normal allowed", fmtRes(res[0]), fmtRes(res[1]))
	}
	res = h.must(shadow(0), req(n, l, 0))
	if res[0].Remaining != 1 || res[1].Remaining != 0 {
		t.Fatalf("after the batch: %s / %s, want shadow 1 left (its denial consumed nothing), normal 0", fmtRes(res[0]), fmtRes(res[1]))
	}
	// A non-shadow denial vetoes the shadow's consumption too.
	res = h.must(shadow(1), req(n, l, 1))
	if !res[0].Allowed || res[1].Allowed {
		t.Fatalf("%s / %s, want shadow allowed, normal denied", fmtRes(res[0]), fmtRes(res[1]))
	}
	if res := h.must(shadow(0)); res[0].Remaining != 1 {
		t.Fatalf("a vetoed batch consumed the shadow's hits: %s", fmtRes(res[0]))
	}
}

// testChangingRequests checks that a new number of requests keeps the
// counter.
func testChangingRequests(t *testing.T, f Factory, alg limiter.Algorithm) {
	h := newHarness(t, f)
	k := h.key("k")
	l := limiter.Limit{Algorithm: alg, Requests: 5, Window: time.Second}
	h.must(req(k, l, 3))
	h.clock.Advance(10 * time.Millisecond)
	for _, n := range []uint64{10, 2, 3, 7} {
		l.Requests = n
		res := h.must(req(k, l, 0))
		if alg != limiter.TokenBucket && res[0].Remaining == n {
			t.Fatalf("limit %d: Remaining %d: the counter was not kept", n, res[0].Remaining)
		}
		h.must(req(k, l, 1))
		h.clock.Advance(37 * time.Millisecond)
	}
	l.Burst = 20
	h.must(req(k, l, 0))
	h.must(req(k, l, 4))
}

// testAllOrNothing checks a batch across all algorithms: one denial
// consumes nothing anywhere.
func testAllOrNothing(t *testing.T, f Factory) {
	h := newHarness(t, f)
	var reqs []limiter.Request
	for _, alg := range algorithms {
		reqs = append(reqs, req(h.key(alg.String()), limiter.Limit{Algorithm: alg, Requests: 3, Window: time.Second}, 1))
	}
	tight := req(h.key("tight"), limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 1, Window: time.Second}, 1)
	h.must(tight)
	for range 3 {
		h.clock.Advance(5 * time.Millisecond)
		res := h.must(append(reqs, tight)...)
		if res[len(res)-1].Allowed {
			t.Fatalf("tight request allowed: %s", fmtRes(res[len(res)-1]))
		}
	}
	probe := make([]limiter.Request, len(reqs))
	for i, r := range reqs {
		r.Hits = 0
		probe[i] = r
	}
	for i, r := range h.must(probe...) {
		if r.Remaining != reqs[i].Limit.Capacity() {
			t.Fatalf("%s: Remaining %d after denied batches, want %d", fmtReqs(reqs[i:i+1]), r.Remaining, reqs[i].Limit.Capacity())
		}
	}
	for range 4 {
		h.must(reqs...)
	}
	h.must(probe...)
}

// testIsolation checks that counters are separated by key, algorithm and
// window.
func testIsolation(t *testing.T, f Factory) {
	h := newHarness(t, f)
	var all []limiter.Request
	for _, key := range []string{h.key("a"), h.key("b")} {
		for _, alg := range algorithms {
			for _, w := range []time.Duration{time.Second, 2 * time.Second} {
				all = append(all, req(key, limiter.Limit{Algorithm: alg, Requests: 2, Window: w}, 2))
			}
		}
	}
	for i, r := range all {
		res := h.must(r)
		if !res[0].Allowed || res[0].Remaining != 0 {
			t.Fatalf("counter %d (%s) shares state with an earlier one: %s", i, fmtReqs(all[i:i+1]), fmtRes(res[0]))
		}
	}
}

// testInvalid checks that malformed batches fail with ErrInvalid and count
// nothing.
func testInvalid(t *testing.T, f Factory) {
	h := newHarness(t, f)
	good := req(h.key("good"), limiter.Limit{Requests: 2, Window: time.Second}, 1)
	bad := map[string]limiter.Request{
		"empty key":      req("", good.Limit, 1),
		"zero requests":  req(good.Key+"x", limiter.Limit{Window: time.Second}, 1),
		"zero window":    req(good.Key+"x", limiter.Limit{Requests: 1}, 1),
		"negative":       req(good.Key+"x", limiter.Limit{Requests: 1, Window: -time.Second}, 1),
		"sub-ms window":  req(good.Key+"x", limiter.Limit{Requests: 1, Window: 1500 * time.Microsecond}, 1),
		"bad algorithm":  req(good.Key+"x", limiter.Limit{Algorithm: 9, Requests: 1, Window: time.Second}, 1),
		"tb sub-ms only": req(good.Key+"x", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1, Window: time.Microsecond}, 1),
		// Beyond limiter's exact range, which the configuration refuses.
		"inexact window": req(good.Key+"x", limiter.Limit{Requests: limiter.MaxWindowRequests + 1, Window: time.Second}, 1),
		"inexact log":    req(good.Key+"x", limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 1 << 62, Window: time.Second}, 1),
	}
	for name, b := range bad {
		err := h.lim.Check(context.Background(), []limiter.Request{good, b}, make([]limiter.Result, 2))
		if !errors.Is(err, limiter.ErrInvalid) {
			t.Errorf("%s: Check = %v, want ErrInvalid", name, err)
		}
	}
	for _, n := range []int{0, 2} {
		err := h.lim.Check(context.Background(), []limiter.Request{good}, make([]limiter.Result, n))
		if !errors.Is(err, limiter.ErrInvalid) {
			t.Errorf("%d results for 1 request: Check = %v, want ErrInvalid", n, err)
		}
	}
	good.Hits = 0
	if res := h.must(good); res[0].Remaining != 2 {
		t.Fatalf("invalid batches consumed: %s", fmtRes(res[0]))
	}
	if err := h.lim.Check(context.Background(), nil, nil); err != nil {
		t.Errorf("empty batch: %v, want nil", err)
	}
}

// testCancelled checks that a cancelled context fails the Check with an
// error wrapping context.Canceled and counts nothing.
func testCancelled(t *testing.T, f Factory) {
	h := newHarness(t, f)
	r := req(h.key("k"), limiter.Limit{Requests: 2, Window: time.Second}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := h.lim.Check(ctx, []limiter.Request{r}, make([]limiter.Result, 1))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: Check = %v, want an error wrapping context.Canceled", err)
	}
	r.Hits = 0
	if res := h.must(r); res[0].Remaining != 2 {
		t.Fatalf("a cancelled Check consumed: %s", fmtRes(res[0]))
	}
}
