package algorithm

import (
	"math"
	"math/big"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// TestSlidingWindowWeightExact: the previous bucket's weight is
// ceil(prev·(W−e)/W) exactly where prev·W passes 2^53 (float64 would round
// the product: at 4,999,003 hits and e = 110,444,333 ms of a 30-day window it
// gave 4,785,997 for 4,785,998) and 2^64 (3 billion a year: uint64 would
// wrap), against math/big.
func TestSlidingWindowWeightExact(t *testing.T) {
	const month, year = 30 * 86_400_000, 365 * 86_400_000
	for _, c := range []struct {
		w, e int64
		prev uint64
	}{
		{month, 110_444_333, 4_999_003},
		{month, 1, 4_999_003},
		{month, month - 1, 5_000_000},
		{year, 12_345_678_901, 3_000_000_000},
		{year, year - 1, 2_999_999_999},
		{1000, 0, 5},
		{1000, 999, 5},
	} {
		a := SlidingWindow{Limit: c.prev, Window: c.w}
		num := new(big.Int).Mul(new(big.Int).SetUint64(c.prev), big.NewInt(c.w-c.e))
		den := big.NewInt(c.w)
		q, m := new(big.Int).QuoRem(num, den, new(big.Int))
		if m.Sign() > 0 {
			q.Add(q, big.NewInt(1))
		}
		if got := a.weight(c.prev, c.e); got != q.Uint64() {
			t.Errorf("weight(%d, e=%d) of W=%d = %d, want %d", c.prev, c.e, c.w, got, q.Uint64())
		}
	}
}

// TestWaitsBeyondDuration: waits longer than a time.Duration holds (292
// years), which limits the configuration accepts can produce, read as the
// largest Duration, as the Redis backend reports them, never as a negative
// or wrapped wait (the memory backend answered -2316860h and 490375h).
func TestWaitsBeyondDuration(t *testing.T) {
	const year = 365 * 24 * time.Hour
	now := int64(1_767_225_600_000)
	tb := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1, Burst: 10000, Window: year}
	d, s := Decide(tb, State{}, now, 10000) // the whole burst: 10,000 years to refill
	if !d.Allowed || d.ResetAfter != math.MaxInt64 {
		t.Errorf("token bucket after its burst: %+v, want admitted, ResetAfter the largest Duration", d)
	}
	if d, _ = Decide(tb, s, now, 5000); d.Allowed || d.RetryAfter != math.MaxInt64 || d.ResetAfter != math.MaxInt64 {
		t.Errorf("token bucket, 5000 more: %+v, want denied, both waits the largest Duration", d)
	}
	sw := limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 1, Window: 2_000_000 * time.Hour}
	_, s = Decide(sw, State{}, now, 1)
	if d, _ = Decide(sw, s, now+1, 1); d.Allowed || d.RetryAfter != math.MaxInt64 || d.ResetAfter <= 0 {
		t.Errorf("sliding window of 2,000,000 hours, second hit: %+v, want denied, RetryAfter the largest Duration", d)
	}
}

// TestTokenBucketWaitsWithTheClockFarBehind: a token bucket of 2^53−1 per
// ms (the largest the configuration accepts) whose clock steps back 2.1 s
// after a hit: the debt at the earlier instant, (At−now)·Limit ticks,
// passes 2^64. The decision is the same either way (denied), but the waits
// were computed from the debt saturated at 2^64−1 and came out 52 ms short:
// a retry at the stated instant was denied, and the bucket was said full
// before the clock had even come back (a review's finding). Exactly: the
// retry is 2,100 ms away (the hit's debt is 1 tick of a 1 ms period), the
// reset too, and admitted then, not a millisecond before.
func TestTokenBucketWaitsWithTheClockFarBehind(t *testing.T) {
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: limiter.MaxExact, Window: time.Millisecond}
	if err := l.ExactRange(); err != nil {
		t.Fatal(err)
	}
	const at = int64(1_767_225_600_000)
	_, s := Decide(l, State{}, at, limiter.MaxExact) // the whole burst, full again 1 ms later
	now := at - 2100
	d, _ := Decide(l, s, now, 1)
	if d.Allowed || d.RetryAfter != 2101*time.Millisecond || d.ResetAfter != 2101*time.Millisecond {
		t.Fatalf("with the clock 2.1 s behind: %+v, want denied, RetryAfter and ResetAfter 2.101s", d)
	}
	if x, _ := Decide(l, s, now+2100, 1); x.Allowed {
		t.Errorf("admitted 1 ms before the stated retry: %+v", x)
	}
	if x, _ := Decide(l, s, now+2101, 1); !x.Allowed {
		t.Errorf("denied at the stated retry: %+v", x)
	}
}
