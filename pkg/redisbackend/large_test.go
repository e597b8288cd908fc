package redisbackend

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
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
	var clock atomic.Int64
	b0 := int64(1_767_225_600_000)/wms + 1
	clock.Store(b0*wms + 1)
	now := func() time.Time { return time.UnixMilli(clock.Load()) }
	for range n {
		backends = append(backends, newSingle(t, r, t.Name()+":", now))
	}
	req = limiter.Request{Key: key("quota"), Limit: limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 5_000_000, Window: w}, Hits: 4_999_003}
	res := make([]limiter.Result, 1)
	if err := backends[0].Check(context.Background(), []limiter.Request{req}, res); err != nil || !res[0].Allowed {
		t.Fatalf("the previous bucket's hits: %v, %+v", err, res[0])
	}
	clock.Store((b0+1)*wms + 110_444_333)
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

// TestHammerBeyond2p53: four instances × 32 goroutines hammer the counter of
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
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, b := range backends {
		for range 32 {
			wg.Go(func() {
				res := make([]limiter.Result, 1)
				for range 10 {
					if err := b.Check(ctx, []limiter.Request{req}, res); err != nil {
						t.Errorf("Check: %v", err)
						return
					}
					if res[0].Allowed {
						admitted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	if got := admitted.Load(); got != 100 {
		t.Errorf("admitted %d of %d with room for 100", got, 4*32*10)
	}
}
