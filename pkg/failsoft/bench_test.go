package failsoft_test

import (
	"context"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/failsoft"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// BenchmarkCheckHealthy measures what the fail-soft layer adds in front of a
// healthy primary (the in-memory backend, so the layer's own cost shows).
func BenchmarkCheckHealthy(b *testing.B) {
	fs := newFailsoft(b, failsoft.Options{Primary: newMemory(b, nil), Fallback: newMemory(b, nil)})
	reqs := []limiter.Request{{Key: "k", Limit: limiter.Limit{Requests: 1 << 30, Window: time.Hour}, Hits: 1}}
	res := make([]limiter.Result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		if err := fs.Check(ctx, reqs, res); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckOpen measures a decision by failure mode while the breaker
// is open (the store is a redisbackend on a closed port).
func BenchmarkCheckOpen(b *testing.B) {
	fs := newFailsoft(b, failsoft.Options{Primary: deadStoreB(b), Fallback: newMemory(b, nil)})
	reqs := []limiter.Request{{Key: "k", Limit: limiter.Limit{Requests: 1 << 30, Window: time.Hour}, Hits: 1}}
	res := make([]limiter.Result, 1)
	for fs.State() != "open" {
		if err := fs.Check(context.Background(), reqs, res); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := fs.Check(context.Background(), reqs, res); err != nil {
			b.Fatal(err)
		}
	}
}
