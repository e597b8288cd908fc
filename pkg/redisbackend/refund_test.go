package redisbackend

import (
	"context"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
)

// TestTokenBucketRefundAfterRefill: a token bucket's refund (a Cluster
// Check whose other slot vetoed) takes back only what the bucket has not
// refilled since the refunded Check. A bucket of 1,000 a second (one hit is
// 1 ms of debt): X takes h hits at 0, Y one hit at d ms, then X's refund
// lands. Without the refill's part, the refund erased Y's hit too (and with
// the key expired and written anew by Y, deleted it), so the bucket admitted
// one more than its burst. (On a single node: the refund script is the
// Cluster's, run here on the counter X's check wrote.)
func TestTokenBucketRefundAfterRefill(t *testing.T) {
	r := testenv.RedisServer(t)
	clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
	ctx := context.Background()
	lim := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1000, Window: time.Second, Burst: 1000}
	for _, c := range []struct {
		name string
		hits uint64 // X's
		d    int64  // ms from X's check to Y's
		want uint64 // hits of debt after the refund: Y's
	}{
		{"X's debt paid off before Y", 1, 5, 1},
		{"X's debt partly paid off", 3, 1, 1},
		{"X and Y in the same millisecond", 2, 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newSingle(t, r, t.Name()+":", clock.Now)
			start := clock.Millis()
			reqs := []limiter.Request{{Key: key("x"), Limit: lim, Hits: c.hits}}
			x, results := admitSlotCall(t, b, reqs)
			clock.SetMillis(start + c.d)
			y := []limiter.Request{{Key: key("x"), Limit: lim, Hits: 1}}
			if err := b.Check(ctx, y, make([]limiter.Result, 1)); err != nil {
				t.Fatalf("Y: %v", err)
			}
			if err := b.refundSlot(ctx, reqs, x, results); err != nil {
				t.Fatalf("refund: %v", err)
			}
			if got := used(t, b, y[0]); got != int64(c.want) {
				t.Errorf("after X's refund the bucket holds %d hits of debt, want %d (Y's)", got, c.want)
			}
		})
	}
}
