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

// TestSlidingWindowBeyond2p53: a sliding window whose count × window passes
// 2^53 (5 million a month) is counted exactly. With 4,999,003 hits in the
// previous bucket and 110,444,333 ms into the current one, the previous
// bucket weighs exactly ceil(4,999,003 × (W − e) / W) = 4,785,998 hits; in
// doubles the product rounds and the weight comes out 4,785,997, which
// admitted one hit more than the limit. (Before, the backend refused such
// limits: every request on them failed.)
func TestSlidingWindowBeyond2p53(t *testing.T) {
	r := testenv.RedisServer(t)
	const w = 30 * 24 * time.Hour
	wms := w.Milliseconds()
	var clock atomic.Int64
	b0 := int64(1_767_225_600_000)/wms + 1
	clock.Store(b0*wms + 1)
	b := newSingle(t, r, t.Name()+":", func() time.Time { return time.UnixMilli(clock.Load()) })
	ctx := context.Background()
	lim := limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 5_000_000, Window: w}
	k := key("quota")
	check := func(hits uint64) limiter.Result {
		t.Helper()
		res := make([]limiter.Result, 1)
		if err := b.Check(ctx, []limiter.Request{{Key: k, Limit: lim, Hits: hits}}, res); err != nil {
			t.Fatalf("Check of %d hits: %v", hits, err)
		}
		return res[0]
	}
	if res := check(4_999_003); !res.Allowed {
		t.Fatalf("the previous bucket's hits: %+v", res)
	}
	clock.Store((b0+1)*wms + 110_444_333)
	const room = 5_000_000 - 4_785_998
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

// TestHammerBeyond2p53: four instances × 32 goroutines hammer one counter of
// 5 million a month whose previous bucket's weight needs the long division
// (the case of TestSlidingWindowBeyond2p53), with room for exactly 100 more
// hits: exactly 100 are admitted.
func TestHammerBeyond2p53(t *testing.T) {
	r := testenv.RedisServer(t)
	const w = 30 * 24 * time.Hour
	wms := w.Milliseconds()
	var clock atomic.Int64
	b0 := int64(1_767_225_600_000)/wms + 1
	clock.Store(b0*wms + 1)
	now := func() time.Time { return time.UnixMilli(clock.Load()) }
	prefix := t.Name() + ":"
	var backends []*Backend
	for range 4 {
		backends = append(backends, newSingle(t, r, prefix, now))
	}
	ctx := context.Background()
	lim := limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 5_000_000, Window: w}
	k := key("quota")
	fill := func(hits uint64) {
		t.Helper()
		res := make([]limiter.Result, 1)
		if err := backends[0].Check(ctx, []limiter.Request{{Key: k, Limit: lim, Hits: hits}}, res); err != nil || !res[0].Allowed {
			t.Fatalf("fill of %d hits: %v, %+v", hits, err, res[0])
		}
	}
	fill(4_999_003)
	clock.Store((b0+1)*wms + 110_444_333)
	const room = 5_000_000 - 4_785_998
	fill(room - 100)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, b := range backends {
		for range 32 {
			wg.Go(func() {
				res := make([]limiter.Result, 1)
				for range 10 {
					if err := b.Check(ctx, []limiter.Request{{Key: k, Limit: lim, Hits: 1}}, res); err != nil {
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
