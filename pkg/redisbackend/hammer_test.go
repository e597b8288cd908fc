package redisbackend

import (
	"fmt"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
)

// hammerAll runs limitertest.Hammer for every algorithm with 1 and 3
// requests per batch: 4 Backend instances (separate clients) sharing one
// store, 32 goroutines each, limit 1000 per window, over two windows. Hammer
// checks that the admitted total equals the reference model's exactly.
func hammerAll(t *testing.T, newInstance func(t *testing.T, now func() time.Time) limiter.Limiter) {
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog} {
		for _, per := range []int{1, 3} {
			t.Run(fmt.Sprintf("%v/batch%d", alg, per), func(t *testing.T) {
				clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
				ls := make([]limiter.Limiter, 4)
				for i := range ls {
					ls[i] = newInstance(t, clock.Now)
				}
				limitertest.Hammer(t, ls, clock, limitertest.HammerOptions{
					Algorithm:  alg,
					Goroutines: 32,
					Limit:      1000,
					Window:     time.Minute,
					Windows:    2,
					PerBatch:   per,
				})
			})
		}
	}
}

func TestHammerSingle(t *testing.T) {
	r := testenv.RedisServer(t)
	hammerAll(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
		return newSingle(t, r, DefaultKeyPrefix, now)
	})
}

// TestHammerCluster hammers coalescing instances (pipelined calls) and, in
// "uncoalesced", instances that send every Check's calls on their own.
func TestHammerCluster(t *testing.T) {
	c := testenv.RedisCluster(t)
	hammerAll(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
		return newClustered(t, c, DefaultKeyPrefix, now)
	})
	t.Run("uncoalesced", func(t *testing.T) {
		hammerAll(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
			return newClusteredSenders(t, c, "u:", now, -1)
		})
	})
}
