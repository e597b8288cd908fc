package redisbackend

import (
	"context"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
)

func TestConformanceSingle(t *testing.T) {
	r := testenv.RedisServer(t)
	var p prefixes
	limitertest.Run(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
		return newSingle(t, r, p.next(), now)
	})
}

func TestConformanceCluster(t *testing.T) {
	c := testenv.RedisCluster(t)
	var p prefixes
	limitertest.Run(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
		return newClustered(t, c, p.next(), now)
	})
}

// TestConformanceSingleUncoalesced runs the suite with coalescing off
// (Options.Senders < 0): every Check is a call of its own.
func TestConformanceSingleUncoalesced(t *testing.T) {
	r := testenv.RedisServer(t)
	var p prefixes
	limitertest.Run(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
		b, err := New(Options{URL: "redis://" + r.Addr, KeyPrefix: p.next(), Now: now, Timeout: testTimeout, Senders: -1})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	})
}

// TestTokenBucketRescaleNeverOverAdmits: a token bucket near the top of the
// exact range (2^53−1 ticks a window) whose limit changes within one batch,
// so the debt is rescaled with (Debt mod Per)·L past 2^53, where Lua's
// doubles round. The script admitted a hit the exact reference denies (a
// review's finding: 1,499 ticks of room for a hit of 1,500); now a rounding
// may deny early but never admits: wherever the model denies, Redis does.
func TestTokenBucketRescaleNeverOverAdmits(t *testing.T) {
	r := testenv.RedisServer(t)
	clock := limitertest.NewClock(time.UnixMilli(1718496119999))
	b := newSingle(t, r, "rescale:", clock.Now)
	big := uint64(limiter.MaxExact) / 1500
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: big, Window: 1500 * time.Millisecond}
	lower := l
	lower.Requests = big - 1
	k := key(t.Name())
	reqs := []limiter.Request{{Key: k, Limit: l, Hits: 1}, {Key: k, Limit: l, Hits: big - 2}, {Key: k, Limit: lower, Hits: 1}, {Key: k, Limit: l, Hits: 0}}
	got := make([]limiter.Result, len(reqs))
	if err := b.Check(context.Background(), reqs, got); err != nil {
		t.Fatal(err)
	}
	want, _ := limitertest.NewModel().Check(clock.Millis(), reqs, false)
	if want[2].Allowed {
		t.Fatalf("the model admits request 2 (%+v): the test needs a denial there", want[2])
	}
	for i := range reqs {
		if got[i].Allowed && !want[i].Allowed {
			t.Errorf("request %d (L=%d, hits %d): Redis admitted %+v, the exact model denies %+v", i, reqs[i].Limit.Requests, reqs[i].Hits, got[i], want[i])
		}
	}
}
