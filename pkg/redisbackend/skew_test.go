package redisbackend

import (
	"context"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// TestRedisClockIgnoresInstanceClocks: two instances deciding on Redis TIME
// (Now nil) enforce one limit, whatever their own clocks say. The algorithms
// used have no window edges (sliding log, token bucket with a refill of one
// hit per 14 minutes), so the test cannot straddle a boundary.
func TestRedisClockIgnoresInstanceClocks(t *testing.T) {
	r := testenv.RedisServer(t)
	a := newSingle(t, r, DefaultKeyPrefix, nil)
	b := newSingle(t, r, DefaultKeyPrefix, nil)
	for _, alg := range []limiter.Algorithm{limiter.SlidingLog, limiter.TokenBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			const limit = 100
			req := limiter.Request{Key: key(t.Name()), Limit: limiter.Limit{Algorithm: alg, Requests: limit, Window: 24 * time.Hour}, Hits: 1}
			if got := admitAll(t, []*Backend{a, b}, req, 20); got != limit {
				t.Errorf("two instances admitted %d, want the limit %d", got, limit)
			}
		})
	}
}

// TestInjectedSkewedClocks shows why production uses Redis TIME: two
// instances whose own clocks differ by 30 s share a 10 s fixed window.
// When the one ahead writes first, the one behind finds the counter in a
// later bucket than its clock says and decides in that bucket (a clock
// behind the stored state never makes a counter forget its count): together
// they admit the limit, and the one behind reports times 30 s too long, a
// Reset three windows away. When the one behind writes first, each counts
// in its own window and together they admit twice the limit.
func TestInjectedSkewedClocks(t *testing.T) {
	r := testenv.RedisServer(t)
	t0 := time.UnixMilli(1_767_225_600_000)
	a := newSingle(t, r, DefaultKeyPrefix, func() time.Time { return t0 })
	b := newSingle(t, r, DefaultKeyPrefix, func() time.Time { return t0.Add(30 * time.Second) })
	const limit = 50
	window := 10 * time.Second
	limitOf := func(name string) limiter.Request {
		return limiter.Request{Key: key(t.Name() + name), Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: limit, Window: window}, Hits: 1}
	}

	behindFirst := limitOf("/behind-first")
	if got := admitAll(t, []*Backend{a}, behindFirst, 10); got != limit {
		t.Errorf("the instance behind, first: admitted %d, want %d", got, limit)
	}
	if got := admitAll(t, []*Backend{b}, behindFirst, 10); got != limit {
		t.Errorf("the instance ahead, after it: admitted %d, want another %d (its own window)", got, limit)
	}

	req := limitOf("/ahead-first")
	if got := admitAll(t, []*Backend{b}, req, 10); got != limit {
		t.Errorf("the instance ahead, first: admitted %d, want %d", got, limit)
	}
	if got := admitAll(t, []*Backend{a}, req, 10); got != 0 {
		t.Errorf("the instance behind, after it: admitted %d, want 0 (it decides in the later bucket)", got)
	}
	res := make([]limiter.Result, 1)
	probe := req
	probe.Hits = 0
	if err := a.Check(context.Background(), []limiter.Request{probe}, res); err != nil {
		t.Fatal(err)
	}
	if res[0].Allowed || res[0].ResetAfter <= window {
		t.Errorf("the instance behind: %+v, want a denial with a Reset beyond one window", res[0])
	}
}

// TestRedisClockToTheMillisecond: on Redis TIME every path of check.lua (a
// Check alone, a call of several Checks, a call with a sliding log) decides
// at Redis's clock in whole milliseconds, sec·1000 + floor(usec/1000): the
// reply's now lies between Redis TIME read before and after the call, and a
// fixed window's now + reset is its bucket's end exactly (a now with a
// fraction of a millisecond would leave the packed reset a millisecond
// short).
func TestRedisClockToTheMillisecond(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newSingle(t, r, DefaultKeyPrefix, nil)
	ctx := context.Background()
	w := time.Minute
	fixed := func(name string) limiter.Request {
		return limiter.Request{Key: key(t.Name(), name), Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1_000_000, Window: w}, Hits: 1}
	}
	log := limiter.Request{Key: key(t.Name(), "log"), Limit: limiter.Limit{Algorithm: limiter.SlidingLog, Requests: 1000, Window: w}, Hits: 1}
	redisMs := func() int64 {
		t.Helper()
		tm, err := r.Client().Time(ctx).Result()
		if err != nil {
			t.Fatalf("TIME: %v", err)
		}
		return tm.UnixMicro() / 1000
	}
	for name, groups := range map[string][][]limiter.Request{
		"alone":              {{fixed("A"), fixed("B")}},
		"several Checks":     {{fixed("A")}, {fixed("A"), fixed("B")}},
		"with a sliding log": {{fixed("A"), log}},
	} {
		t.Run(name, func(t *testing.T) {
			keys, argv := encodeGroups(b, groups...)
			// A call whose usec is a whole number of ms (one in a thousand)
			// would not show a fraction: twenty calls.
			for range 20 {
				before := redisMs()
				v, err := b.runCheck(ctx, &batch{}, keys, argv, b.flags[0]).Result()
				if err != nil {
					t.Fatalf("check: %v", err)
				}
				after := redisMs()
				for i, gr := range decodeGroups(t, v, groups) {
					if gr.now < before || gr.now > after {
						t.Errorf("group %d decided at %d, want within Redis TIME [%d, %d]", i+1, gr.now, before, after)
					}
					for j, x := range gr.res {
						if groups[i][j].Limit.Algorithm == limiter.FixedWindow {
							if end := gr.now + x.ResetAfter.Milliseconds(); end%w.Milliseconds() != 0 {
								t.Errorf("group %d request %d: now %d + reset %v = %d, want its bucket's end", i+1, j+1, gr.now, x.ResetAfter, end)
							}
						}
					}
				}
			}
		})
	}
}
