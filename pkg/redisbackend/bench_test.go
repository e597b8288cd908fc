package redisbackend

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// benchCheck measures Check against a local redis-server on Redis TIME (the
// production path), with limits high enough that every Check is admitted and
// writes. Each Check is one EVALSHA.
func benchCheck(b *testing.B, reqs []limiter.Request) {
	r := testenv.RedisServer(b)
	be := newSingle(b, r, DefaultKeyPrefix, nil)
	ctx := context.Background()
	res := make([]limiter.Result, len(reqs))
	if err := be.Check(ctx, reqs, res); err != nil { // load the script
		b.Fatalf("Check: %v", err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := be.Check(ctx, reqs, res); err != nil {
			b.Fatalf("Check: %v", err)
		}
	}
	b.StopTimer()
	for i, x := range res {
		if !x.Allowed {
			b.Fatalf("request %d denied: %+v", i, x)
		}
	}
}

func benchReq(alg limiter.Algorithm, name string) limiter.Request {
	return limiter.Request{
		Key:   key("bench", name),
		Limit: limiter.Limit{Algorithm: alg, Requests: 1 << 30, Window: time.Hour},
		Hits:  1,
	}
}

func BenchmarkCheck(b *testing.B) {
	b.Run("requests=1", func(b *testing.B) {
		benchCheck(b, []limiter.Request{benchReq(limiter.SlidingWindow, "a")})
	})
	b.Run("requests=3", func(b *testing.B) {
		benchCheck(b, []limiter.Request{
			benchReq(limiter.SlidingWindow, "a"),
			benchReq(limiter.TokenBucket, "b"),
			benchReq(limiter.FixedWindow, "c"),
		})
	})
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog} {
		b.Run(fmt.Sprintf("algorithm=%v", alg), func(b *testing.B) {
			req := benchReq(alg, "x")
			if alg == limiter.SlidingLog {
				// The log holds every hit of the window: keep it small.
				req.Limit = limiter.Limit{Algorithm: alg, Requests: 10000, Window: time.Second}
				req.Hits = 0
			}
			benchCheck(b, []limiter.Request{req})
		})
	}
}

// BenchmarkBaseKey measures the key derivation (SHA-256 of the identity).
func BenchmarkBaseKey(b *testing.B) {
	r := limiter.Request{Key: key("edge", "rule", "user", "bob", "path", "/pay"), Limit: limiter.Limit{Requests: 1, Window: time.Second}}
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = appendBaseKey(buf[:0], DefaultKeyPrefix, &r)
	}
}
