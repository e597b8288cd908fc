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
