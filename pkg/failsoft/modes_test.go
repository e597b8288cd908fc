package failsoft_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/failsoft"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
	"github.com/envoy-rls/envoy-rls/pkg/redisbackend"
)

// deadStore returns a real redisbackend pointing at a loopback port nobody
// listens on: every call fails with connection refused.
func deadStore(t *testing.T) *redisbackend.Backend { return deadStoreB(t) }

func deadStoreB(t testing.TB) *redisbackend.Backend {
	t.Helper()
	return newRedisBackend(t, redisbackend.Options{URL: "redis://" + testenv.FreeAddr(t)})
}

// denyRetryAfter is the documented RetryAfter of a deny-mode decision with
// the default breaker.
var denyRetryAfter = max(failsoft.DefaultOpenTimeout, time.Second)

// expect computes what the fail-soft layer must answer for reqs while the
// store is down: fallback requests by the model at their share of n
// instances, vetoed by a non-shadow deny-mode request; allow and deny as
// documented.
func expect(m *limitertest.Model, now int64, n int, reqs []limiter.Request) []limiter.Result {
	want := make([]limiter.Result, len(reqs))
	var sub []limiter.Request
	var at []int
	denied := false
	for i, r := range reqs {
		switch r.FailureMode {
		case limiter.FailFallback:
			r.Limit = failsoft.Share(r.Limit, n)
			sub = append(sub, r)
			at = append(at, i)
		case limiter.FailAllow:
			want[i] = limiter.Result{Allowed: true, Remaining: r.Limit.Capacity(), ResetAfter: r.Limit.Window,
				Source: limiter.SourceFailAllow}
		case limiter.FailDeny:
			want[i] = limiter.Result{ResetAfter: denyRetryAfter, RetryAfter: denyRetryAfter,
				Source: limiter.SourceFailDeny}
			denied = denied || !r.Shadow
		}
	}
	got, _ := m.Check(now, sub, denied)
	for j, res := range got {
		res.Source = limiter.SourceFallback
		want[at[j]] = res
	}
	return want
}

func TestModesAgainstModelWithDeadStore(t *testing.T) {
	const instances = 3
	clock := limitertest.NewClock(time.UnixMilli(1_700_000_000_123))
	rec := newRecorder()
	logger, logs := newLogs(t)
	fs := newFailsoft(t, failsoft.Options{
		Primary:   deadStore(t),
		Fallback:  newMemory(t, clock.Now),
		Instances: instances,
		Observer:  rec,
		Logger:    logger,
	})

	limits := []limiter.Limit{
		{Algorithm: limiter.SlidingWindow, Requests: 20, Window: time.Second},
		{Algorithm: limiter.FixedWindow, Requests: 11, Window: 2 * time.Second},
		{Algorithm: limiter.TokenBucket, Requests: 9, Window: time.Second, Burst: 15},
		{Algorithm: limiter.TokenBucket, Requests: 30, Window: 3 * time.Second},
		{Algorithm: limiter.SlidingLog, Requests: 7, Window: 500 * time.Millisecond},
		{Algorithm: limiter.FixedWindow, Requests: 2, Window: time.Second}, // share rounds to 1
	}
	keys := []string{"a", "b", "c"}
	m := limitertest.NewModel()
	rng := rand.New(rand.NewPCG(7, 11))
	sources := map[limiter.Source]int{}
	for step := 0; step < 400; step++ {
		reqs := make([]limiter.Request, 1+rng.IntN(4))
		for i := range reqs {
			r := limiter.Request{
				Key:    keys[rng.IntN(len(keys))],
				Limit:  limits[rng.IntN(len(limits))],
				Hits:   uint64(rng.IntN(5)),
				Shadow: rng.IntN(8) == 0,
			}
			switch p := rng.IntN(20); {
			case p < 2:
				r.FailureMode = limiter.FailDeny
			case p < 5:
				r.FailureMode = limiter.FailAllow
			}
			reqs[i] = r
		}
		want := expect(m, clock.Millis(), instances, reqs)
		got := make([]limiter.Result, len(reqs))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err := fs.Check(ctx, reqs, got)
		cancel()
		if err != nil {
			t.Fatalf("step %d: Check(%+v) = %v; a store outage must be answered", step, reqs, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d: Check(%+v)\n got %+v\nwant %+v", step, reqs, got, want)
		}
		for _, r := range got {
			sources[r.Source]++
		}
		clock.Advance(time.Duration(rng.IntN(150)) * time.Millisecond)
	}
	for _, s := range []limiter.Source{limiter.SourceFallback, limiter.SourceFailAllow, limiter.SourceFailDeny} {
		if sources[s] == 0 {
			t.Errorf("no result with source %v: the test did not exercise it", s)
		}
	}

	fallback, states, errs := rec.snapshot()
	if !reflect.DeepEqual(fallback, []bool{true}) {
		t.Errorf("Observer.FallbackActive calls = %v, want one [true] for one outage", fallback)
	}
	if n := logs.count("store unavailable: deciding by failure_mode"); n != 1 {
		t.Errorf("outage logged %d times, want once", n)
	}
	if len(states) == 0 || states[0] != "open" || fs.State() == "closed" {
		t.Errorf("breaker states %v, now %q: want it to open on a dead store", states, fs.State())
	}
	// go-redis retries a refused dial until the deadline, so the kind may be
	// "timeout" or "connection"; either way the breaker opened after
	// DefaultConsecutiveFailures failed calls and kept the rest away.
	failed := 0
	for kind, n := range errs {
		switch kind {
		case "timeout", "connection":
			failed += n
		case "circuit_open":
		default:
			t.Errorf("store error kind %q for a refused connection", kind)
		}
	}
	if failed < failsoft.DefaultConsecutiveFailures || errs["circuit_open"] == 0 {
		t.Errorf("store errors by kind %v: want at least %d failed calls, then calls kept away by the open breaker",
			errs, failsoft.DefaultConsecutiveFailures)
	}
	if got := fs.Instances(); got != instances {
		t.Errorf("Instances() = %d, want the override %d", got, instances)
	}
}

func TestDenyVetoesFallbackConsumption(t *testing.T) {
	clock := limitertest.NewClock(time.UnixMilli(1_700_000_000_000))
	fs := newFailsoft(t, failsoft.Options{Primary: deadStore(t), Fallback: newMemory(t, clock.Now), Instances: 2})
	m := limitertest.NewModel()
	lim := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 10, Window: time.Minute}
	fb := limiter.Request{Key: "k", Limit: lim, Hits: 3}
	big := limiter.Request{Key: "k2", Limit: lim, Hits: 6} // over its share of 5: denied on its own
	deny := limiter.Request{Key: "d", Limit: lim, Hits: 1, FailureMode: limiter.FailDeny}
	shadowDeny := deny
	shadowDeny.Shadow = true
	probe := limiter.Request{Key: "k", Limit: lim} // Hits 0: remaining without consuming

	check := func(reqs ...limiter.Request) []limiter.Result {
		t.Helper()
		got := make([]limiter.Result, len(reqs))
		if err := fs.Check(context.Background(), reqs, got); err != nil {
			t.Fatalf("Check: %v", err)
		}
		if want := expect(m, clock.Millis(), 2, reqs); !reflect.DeepEqual(got, want) {
			t.Fatalf("Check(%+v)\n got %+v\nwant %+v", reqs, got, want)
		}
		return got
	}
	before := check(probe)[0].Remaining

	// A non-shadow deny vetoes the batch: the fallback request reports its
	// own decision (admitted) but consumes nothing; big reports its own
	// denial for its real hits.
	if got := check(fb, big, deny); !got[0].Allowed || got[1].Allowed || got[2].Allowed {
		t.Errorf("fallback, big, deny = %+v: want allowed, denied, denied", got)
	}
	if after := check(probe)[0].Remaining; after != before {
		t.Errorf("remaining %d after a vetoed batch, %d before: the veto must stop consumption", after, before)
	}
	// A shadow deny does not veto: the fallback request consumes.
	check(fb, shadowDeny)
	if after := check(probe)[0].Remaining; after != before-fb.Hits {
		t.Errorf("remaining %d after a batch with a shadow deny, want %d", after, before-fb.Hits)
	}
	// The fallback requests are one all-or-nothing batch: big's denial
	// stops fb's consumption too.
	check(fb, big)
	if after := check(probe)[0].Remaining; after != before-fb.Hits {
		t.Errorf("remaining %d after a batch denied in the fallback, want %d", after, before-fb.Hits)
	}
}

func TestErrorsThatAreNotOutages(t *testing.T) {
	rec := newRecorder()
	fs := newFailsoft(t, failsoft.Options{Primary: deadStore(t), Fallback: newMemory(t, nil), Observer: rec})
	ok := limiter.Request{Key: "k", Limit: limiter.Limit{Requests: 5, Window: time.Second}, Hits: 1}

	if err := fs.Check(context.Background(), []limiter.Request{ok}, nil); !errors.Is(err, limiter.ErrInvalid) {
		t.Errorf("Check with too few results = %v, want ErrInvalid", err)
	}
	bad := ok
	bad.Key = ""
	if err := fs.Check(context.Background(), []limiter.Request{bad}, make([]limiter.Result, 1)); !errors.Is(err, limiter.ErrInvalid) {
		t.Errorf("Check with an empty key = %v, want ErrInvalid", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := fs.Check(ctx, []limiter.Request{ok}, make([]limiter.Result, 1)); err == nil {
		t.Error("Check with a cancelled context succeeded, want the caller's error back")
	}
	if fallback, states, errs := rec.snapshot(); len(fallback)+len(states)+len(errs) != 0 {
		t.Errorf("observer saw fallback %v, states %v, errors %v: none of these calls is a store outage", fallback, states, errs)
	}
}

func TestHealthyPrimaryDecides(t *testing.T) {
	rec := newRecorder()
	fallback := newMemory(t, nil)
	fs := newFailsoft(t, failsoft.Options{Primary: newMemory(t, nil), Fallback: fallback, Observer: rec})
	reqs := []limiter.Request{
		{Key: "k", Limit: limiter.Limit{Requests: 2, Window: time.Minute}, Hits: 1},
		{Key: "d", Limit: limiter.Limit{Requests: 2, Window: time.Minute}, Hits: 1, FailureMode: limiter.FailDeny},
	}
	for i := 0; i < 3; i++ {
		got := make([]limiter.Result, len(reqs))
		if err := fs.Check(context.Background(), reqs, got); err != nil {
			t.Fatalf("Check: %v", err)
		}
		for _, r := range got {
			if r.Source != limiter.SourceStore || r.Allowed != (i < 2) {
				t.Errorf("check %d: %+v, want the store's decision (allowed for the first two)", i, r)
			}
		}
	}
	if fallback.Len() != 0 {
		t.Errorf("fallback holds %d counters while the primary is healthy", fallback.Len())
	}
	if fb, states, errs := rec.snapshot(); len(fb)+len(states)+len(errs) != 0 || fs.FallbackActive() || fs.State() != "closed" {
		t.Errorf("healthy store: observer saw %v %v %v, FallbackActive %v, state %q", fb, states, errs, fs.FallbackActive(), fs.State())
	}
}

func TestShareNeverExceedsTheLimit(t *testing.T) {
	for n := 1; n <= 12; n++ {
		for l := uint64(1); l <= 300; l++ {
			for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.TokenBucket} {
				lim := limiter.Limit{Algorithm: alg, Requests: l, Window: time.Second, Burst: 2 * l}
				s := failsoft.Share(lim, n)
				total := uint64(n) * s.Capacity()
				capacity := lim.Capacity()
				if s.Requests < 1 || s.Window != lim.Window || s.Algorithm != alg {
					t.Fatalf("Share(%+v, %d) = %+v", lim, n, s)
				}
				if capacity >= uint64(n) && (total > capacity || total+uint64(n) <= capacity) {
					t.Fatalf("Share(%+v, %d) = %+v: %d instances admit %d together, want within (L−n, L]", lim, n, s, n, total)
				}
				if capacity < uint64(n) && s.Capacity() != 1 {
					t.Fatalf("Share(%+v, %d) = %+v: want at least 1 per instance", lim, n, s)
				}
			}
		}
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	mem := newMemory(t, nil)
	for name, o := range map[string]failsoft.Options{
		"no primary":         {Fallback: mem},
		"no fallback":        {Primary: mem},
		"negative instances": {Primary: mem, Fallback: mem, Instances: -1},
		"negative margin":    {Primary: mem, Fallback: mem, DeadlineMargin: -time.Millisecond},
		"ratio above 1":      {Primary: mem, Fallback: mem, Breaker: failsoft.BreakerOptions{FailureRatio: 1.5}},
	} {
		if _, err := failsoft.New(o); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}
