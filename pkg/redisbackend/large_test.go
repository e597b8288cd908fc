package redisbackend

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
)

// longDivisionQuota returns n Backends on one redis-server, sharing an
// injected clock, and a one-hit request on a counter of 5 million a month
// (count × window beyond 2^53) whose previous bucket holds 4,999,003 hits,
// the clock 110,444,333 ms into the current bucket. The previous bucket then
// weighs exactly ceil(4,999,003 × (W − e) / W) = 4,785,998 hits, so room is
// 214,002; in doubles the product rounds and the weight comes out 4,785,997,
// one hit of room too many.
func longDivisionQuota(t *testing.T, n int) (backends []*Backend, req limiter.Request, room uint64) {
	t.Helper()
	r := testenv.RedisServer(t)
	const w = 30 * 24 * time.Hour
	wms := w.Milliseconds()
	b0 := int64(1_767_225_600_000)/wms + 1
	clock := limitertest.NewClock(time.UnixMilli(b0*wms + 1))
	for range n {
		backends = append(backends, newSingle(t, r, t.Name()+":", clock.Now))
	}
	req = limiter.Request{Key: key("quota"), Limit: limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 5_000_000, Window: w}, Hits: 4_999_003}
	res := make([]limiter.Result, 1)
	if err := backends[0].Check(context.Background(), []limiter.Request{req}, res); err != nil || !res[0].Allowed {
		t.Fatalf("the previous bucket's hits: %v, %+v", err, res[0])
	}
	clock.SetMillis((b0+1)*wms + 110_444_333)
	req.Hits = 1
	return backends, req, 5_000_000 - 4_785_998
}

// TestSlidingWindowBeyond2p53: a sliding window whose count × window passes
// 2^53 (5 million a month) is counted exactly (longDivisionQuota): the room
// reported, admitted, and not one hit more. (Before, the backend refused
// such limits: every request on them failed.)
func TestSlidingWindowBeyond2p53(t *testing.T) {
	backends, req, room := longDivisionQuota(t, 1)
	check := func(hits uint64) limiter.Result {
		t.Helper()
		res := make([]limiter.Result, 1)
		q := req
		q.Hits = hits
		if err := backends[0].Check(context.Background(), []limiter.Request{q}, res); err != nil {
			t.Fatalf("Check of %d hits: %v", hits, err)
		}
		return res[0]
	}
	if res := check(0); res.Remaining != room {
		t.Fatalf("remaining %d, want %d", res.Remaining, room)
	}
	if res := check(room); !res.Allowed {
		t.Fatalf("%d hits (the room left): %+v", room, res)
	}
	if res := check(1); res.Allowed {
		t.Errorf("one hit beyond the limit admitted: %+v", res)
	}
}

// TestHammerBeyond2p53: four instances × 8 goroutines (admitAll) hammer the counter of
// longDivisionQuota, filled to leave room for exactly 100 more hits: exactly
// 100 are admitted.
func TestHammerBeyond2p53(t *testing.T) {
	backends, req, room := longDivisionQuota(t, 4)
	ctx := context.Background()
	fill := req
	fill.Hits = room - 100
	res := make([]limiter.Result, 1)
	if err := backends[0].Check(ctx, []limiter.Request{fill}, res); err != nil || !res[0].Allowed {
		t.Fatalf("fill of %d hits: %v, %+v", fill.Hits, err, res[0])
	}
	if got := admitAll(t, backends, req, 40); got != 100 {
		t.Errorf("admitted %d of %d with room for 100", got, 4*8*40)
	}
}

// TestExactRangeBoundaries: the largest limit of each algorithm that the
// configuration accepts (descriptors.Countable) is counted exactly on Redis,
// to the last hit, and one step beyond is refused by both. A limit that
// loads but fails every request was possible before (a window of 2^51
// requests, a sliding log of 10,000 a 30 years, a token bucket at exactly
// burst × window = 2^53 − 992).
func TestExactRangeBoundaries(t *testing.T) {
	r := testenv.RedisServer(t)
	fixed := time.UnixMilli(1_767_225_600_123)
	b := newSingle(t, r, t.Name()+":", func() time.Time { return fixed })
	const second, hour = time.Second, time.Hour
	logWindow := time.Duration(limiter.MaxExact/descriptors.MaxSlidingLogRequests) * time.Millisecond
	for _, c := range []struct {
		name       string
		at, beyond limiter.Limit
	}{
		{"sliding window", limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: limiter.MaxWindowRequests, Window: hour},
			limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: limiter.MaxWindowRequests + 1, Window: hour}},
		{"fixed window", limiter.Limit{Algorithm: limiter.FixedWindow, Requests: limiter.MaxWindowRequests, Window: hour},
			limiter.Limit{Algorithm: limiter.FixedWindow, Requests: limiter.MaxWindowRequests + 1, Window: hour}},
		{"token bucket", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: limiter.MaxExact / 1000, Window: second},
			limiter.Limit{Algorithm: limiter.TokenBucket, Requests: limiter.MaxExact/1000 + 1, Window: second}},
		{"token bucket burst", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Burst: limiter.MaxExact / 1000, Window: second},
			limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Burst: limiter.MaxExact/1000 + 1, Window: second}},
		{"sliding log", limiter.Limit{Algorithm: limiter.SlidingLog, Requests: descriptors.MaxSlidingLogRequests, Window: logWindow},
			limiter.Limit{Algorithm: limiter.SlidingLog, Requests: descriptors.MaxSlidingLogRequests, Window: logWindow + time.Millisecond}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := descriptors.Countable(c.at); err != nil {
				t.Fatalf("the configuration refuses %+v: %v", c.at, err)
			}
			if err := descriptors.Countable(c.beyond); err == nil {
				t.Fatalf("the configuration accepts %+v", c.beyond)
			}
			res := make([]limiter.Result, 1)
			beyond := limiter.Request{Key: key(c.name, "beyond"), Limit: c.beyond, Hits: 1}
			if err := b.Check(context.Background(), []limiter.Request{beyond}, res); !errors.Is(err, limiter.ErrInvalid) {
				t.Fatalf("Check beyond the range: %v, want ErrInvalid", err)
			}
			capacity := c.at.Capacity()
			for _, step := range []struct {
				hits, remaining uint64
				allowed         bool
			}{{1, capacity - 1, true}, {capacity - 1, 0, true}, {1, 0, false}} {
				req := limiter.Request{Key: key(c.name, "at"), Limit: c.at, Hits: step.hits}
				if err := b.Check(context.Background(), []limiter.Request{req}, res); err != nil {
					t.Fatalf("Check of %d hits: %v", step.hits, err)
				}
				if res[0].Allowed != step.allowed || res[0].Remaining != step.remaining {
					t.Fatalf("Check of %d hits: allowed %v remaining %d, want %v and %d", step.hits, res[0].Allowed, res[0].Remaining, step.allowed, step.remaining)
				}
			}
		})
	}
}

// TestTokenBucketRetryAfterAtTheTop: a token bucket whose burst × window is
// just below 2^53, emptied by its whole burst, denies one hit a millisecond
// later with the Retry-After of pkg/algorithm (the reference model, whose
// results every Check must match), to the millisecond: the hit is denied
// one millisecond before that and admitted then. Before, the script
// computed the Retry-After as ceil((rel + c·W − B·W) / L) in doubles, and
// rel + c·W, beyond 2^53, rounded to even: 7 a day with a burst of
// 104,249,991 said 12,342,856 ms where 12,342,857 is exact (admitted too
// early), 1 per 999 ms with the largest burst said 999 ms for 998.
func TestTokenBucketRetryAfterAtTheTop(t *testing.T) {
	r := testenv.RedisServer(t)
	const ms = time.Millisecond
	for _, c := range []struct {
		name  string
		limit limiter.Limit
		retry time.Duration // of one hit, 1 ms after the burst
	}{
		{"7 a day, burst 104,249,991", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 7, Burst: limiter.MaxExact / 86_400_000, Window: 24 * time.Hour}, 12_342_857 * ms},
		{"1 per 999 ms, burst 9,016,215,470,211", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1, Burst: limiter.MaxExact / 999, Window: 999 * ms}, 998 * ms},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := descriptors.Countable(c.limit); err != nil {
				t.Fatalf("the configuration refuses %+v: %v", c.limit, err)
			}
			clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
			b := newSingle(t, r, t.Name()+":", clock.Now)
			model := limitertest.NewModel()
			check := func(hits uint64) limiter.Result {
				t.Helper()
				reqs := []limiter.Request{{Key: key("bucket"), Limit: c.limit, Hits: hits}}
				res := make([]limiter.Result, 1)
				if err := b.Check(context.Background(), reqs, res); err != nil {
					t.Fatalf("Check of %d hits: %v", hits, err)
				}
				want, _ := model.Check(clock.Millis(), reqs, false)
				if res[0] != want[0] {
					t.Errorf("%d hits at %d ms: Redis decided %+v, pkg/algorithm %+v", hits, clock.Millis(), res[0], want[0])
				}
				return res[0]
			}
			if res := check(c.limit.Capacity()); !res.Allowed || res.Remaining != 0 {
				t.Fatalf("the whole burst: %+v, want admitted, none remaining", res)
			}
			clock.Advance(ms)
			if res := check(1); res.Allowed || res.RetryAfter != c.retry {
				t.Fatalf("one hit 1 ms later: %+v, want denied with Retry-After %v", res, c.retry)
			}
			clock.Advance(c.retry - ms)
			if res := check(1); res.Allowed {
				t.Errorf("one hit admitted 1 ms before its Retry-After: %+v", res)
			}
			clock.Advance(ms)
			if res := check(1); !res.Allowed {
				t.Errorf("one hit denied at its Retry-After: %+v", res)
			}
		})
	}
}
