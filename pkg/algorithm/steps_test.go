package algorithm

import (
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// step is one call of a step table: at t (ms after a window-aligned base)
// ask for hits and expect the decision.
type step struct {
	t    int64
	hits uint64
	want Decision
}

const base = 1_767_225_600_000 // midnight UTC: aligned to every window below

func runSteps(t *testing.T, l limiter.Limit, steps []step) {
	t.Helper()
	var s State
	for i, st := range steps {
		d, ns := Decide(l, s, base+st.t, st.hits)
		if d != st.want {
			t.Errorf("step %d (t=%d hits=%d): got %+v, want %+v", i, st.t, st.hits, d, st.want)
		}
		s = ns
	}
}

func dec(allowed bool, remaining uint64, reset, retry time.Duration) Decision {
	return Decision{Allowed: allowed, Remaining: remaining, ResetAfter: reset, RetryAfter: retry}
}

const ms1 = time.Millisecond

func TestSlidingWindowSteps(t *testing.T) {
	l := limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 4, Window: time.Second}
	runSteps(t, l, []step{
		{0, 1, dec(true, 3, 1000*ms1, 0)},
		{100, 3, dec(true, 0, 900*ms1, 0)},
		{200, 1, dec(false, 0, 800*ms1, 800*ms1+250*ms1)}, // next bucket: pw = ceil(4·(W−e)/W) ≤ 3 ⇒ e ≥ 250
		{200, 0, dec(false, 0, 800*ms1, 1050*ms1)},        // check only: same answer, nothing consumed
		{1249, 1, dec(false, 0, 751*ms1, 1*ms1)},          // pw = ceil(4·751/1000) = 4
		{1250, 1, dec(true, 0, 750*ms1, 0)},               // pw = 3
		{1500, 1, dec(true, 0, 500*ms1, 0)},               // pw = 2, cur 1 → 2
		{1500, 1, dec(false, 0, 500*ms1, 250*ms1)},        // needs pw ≤ 1: e ≥ 750
		{1999, 5, dec(false, 1, 1*ms1, 1000*ms1)},         // more than L: never, RetryAfter = W; pw = 1
		{2000, 0, dec(true, 2, 1000*ms1, 0)},              // prev = 2, pw = 2
		{3000, 0, dec(true, 4, 1000*ms1, 0)},              // two buckets later: empty
	})
}

func TestFixedWindowSteps(t *testing.T) {
	l := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 3, Window: time.Second}
	runSteps(t, l, []step{
		{10, 2, dec(true, 1, 990*ms1, 0)},
		{20, 2, dec(false, 1, 980*ms1, 980*ms1)},
		{30, 0, dec(true, 1, 970*ms1, 0)},
		{999, 1, dec(true, 0, 1*ms1, 0)},
		{999, 0, dec(false, 0, 1*ms1, 1*ms1)},
		{1000, 3, dec(true, 0, 1000*ms1, 0)},
		{1500, 4, dec(false, 0, 500*ms1, 1000*ms1)},
		{2000, 0, dec(true, 3, 1000*ms1, 0)},
	})
}

func TestTokenBucketSteps(t *testing.T) {
	// 2 per second (T = 500ms), burst 3 (tau = 1500ms).
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 2, Burst: 3, Window: time.Second}
	runSteps(t, l, []step{
		{0, 3, dec(true, 0, 1500*ms1, 0)},
		{0, 1, dec(false, 0, 1500*ms1, 500*ms1)},
		{499, 1, dec(false, 0, 1001*ms1, 1*ms1)},
		{500, 1, dec(true, 0, 1500*ms1, 0)},
		{750, 0, dec(false, 0, 1250*ms1, 250*ms1)},
		{1000, 2, dec(false, 1, 1000*ms1, 500*ms1)},
		{1000, 4, dec(false, 1, 1000*ms1, 1000*ms1)}, // more than the burst
		{5000, 0, dec(true, 3, 0, 0)},
	})
	// Limit 3 per second: T = 333.33…ms, exact in ticks of 1/3 ms.
	l = limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 3, Window: time.Second}
	runSteps(t, l, []step{
		{0, 3, dec(true, 0, 1000*ms1, 0)},
		{0, 1, dec(false, 0, 1000*ms1, 334*ms1)}, // ceil(333.33…)
		{333, 1, dec(false, 0, 667*ms1, 1*ms1)},
		{334, 1, dec(true, 0, 1000*ms1, 0)}, // debt 3000 − 1002 + 1000 = 2998 ticks: 999.33ms
	})
}

func TestSlidingLogSteps(t *testing.T) {
	l := limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 3, Window: time.Second}
	runSteps(t, l, []step{
		{0, 1, dec(true, 2, 1000*ms1, 0)},
		{300, 2, dec(true, 0, 700*ms1, 0)},
		{400, 1, dec(false, 0, 600*ms1, 600*ms1)}, // the hit at 0 must leave: at 1000
		{400, 3, dec(false, 0, 600*ms1, 900*ms1)}, // all three: the hits at 300 leave at 1300
		{999, 1, dec(false, 0, 1*ms1, 1*ms1)},
		{1000, 1, dec(true, 0, 300*ms1, 0)},         // (0, 1000]: 0 has left
		{1000, 4, dec(false, 0, 300*ms1, 1000*ms1)}, // more than L
		{2000, 0, dec(true, 3, 1000*ms1, 0)},        // (1000, 2000] is empty
	})
}
