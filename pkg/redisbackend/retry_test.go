package redisbackend

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
)

// TestSlidingWindowDenialsOfLongWindows: denials on sliding windows of an
// hour to a year, where the retry instant lies in this bucket, at the start
// of the next (the request fits the current bucket's count alone: cur + c
// = L with the previous bucket still weighing) or later, agree with
// pkg/algorithm to the millisecond. The Lua found the next bucket's start by
// stepping down from two buckets ahead one ms at a time: W steps per
// denial, 1.5 s of a busy Redis for an hourly limit, minutes for a daily
// one. Its walk is now bounded (sw_walk_max), so a wrong estimate fails the
// call instead, and this test with it.
func TestSlidingWindowDenialsOfLongWindows(t *testing.T) {
	r := testenv.RedisServer(t)
	rng := rand.New(rand.NewPCG(8, 2026))
	clock := limitertest.NewClock(time.UnixMilli(0))
	b := newSingle(t, r, t.Name()+":", clock.Now)
	n := 0
	for _, w := range []time.Duration{time.Hour, 24 * time.Hour, 30 * 24 * time.Hour, 365 * 24 * time.Hour} {
		for _, limit := range []uint64{2, 10, 5_000_000} {
			l := limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: limit, Window: w}
			wms := w.Milliseconds()
			for scenario := range 20 {
				n++
				req := limiter.Request{Key: key("k", w.String(), fmt.Sprint(limit, scenario)), Limit: l}
				m := limitertest.NewModel()
				at := (int64(1_767_225_600_000)/wms+1)*wms - 1 - rng.Int64N(wms/2) // in bucket b-1
				step := func(hits uint64) limiter.Result {
					t.Helper()
					clock.SetMillis(at)
					req.Hits = hits
					res := make([]limiter.Result, 1)
					if err := b.Check(context.Background(), []limiter.Request{req}, res); err != nil {
						t.Fatalf("W %v, L %d, scenario %d, %d hits at %d: %v", w, limit, scenario, hits, at, err)
					}
					if want, _ := m.Check(at, []limiter.Request{req}, false); res[0] != want[0] {
						t.Fatalf("W %v, L %d, scenario %d, %d hits at %d: Redis %+v, pkg/algorithm %+v", w, limit, scenario, hits, at, res[0], want[0])
					}
					return res[0]
				}
				prev := 1 + rng.Uint64N(limit)
				step(prev)                  // the previous bucket
				at += 1 + rng.Int64N(wms/2) // into bucket b
				cur := rng.Uint64N(step(0).Remaining + 1)
				step(cur)
				at += rng.Int64N(wms / 4)
				// Denied while the previous bucket weighs: the retry lies
				// in this bucket, at the next one's start (c = L - cur),
				// or beyond.
				for _, c := range []uint64{limit - cur, limit - cur + 1 + rng.Uint64N(cur+1), 1 + rng.Uint64N(limit)} {
					if c > 0 && c <= limit {
						step(c)
					}
				}
			}
		}
	}
	t.Logf("%d scenarios", n)
}
