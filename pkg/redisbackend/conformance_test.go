package redisbackend

import (
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
