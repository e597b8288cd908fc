package memorybackend

import (
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
)

func TestConformance(t *testing.T) {
	limitertest.Run(t, func(t *testing.T, now func() time.Time) limiter.Limiter {
		b := New(Options{Now: now})
		t.Cleanup(func() { b.Close() })
		return b
	})
}

func TestHammer(t *testing.T) {
	clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000))
	b := New(Options{Now: clock.Now, Shards: 4})
	defer b.Close()
	// 64 goroutines on one store, spread over four handles of it.
	limitertest.HammerAll(t, []limiter.Limiter{b, b, b, b}, clock, 16)
}
