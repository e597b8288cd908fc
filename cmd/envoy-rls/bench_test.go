package main

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
	"github.com/envoy-rls/envoy-rls/pkg/metrics"
	"github.com/envoy-rls/envoy-rls/pkg/rls"
)

// benchConfigDir holds the limits `make bench` serves (scripts/bench.sh
// copies it into envoy-rls's config folder).
const benchConfigDir = "../../testdata/bench"

// BenchmarkShouldRateLimitRedis measures one request through the stack serve
// builds on Redis (deny cache, fail-soft, store timing, the Redis backend
// with coalescing) against a real redis-server, without gRPC, each request
// with a deadline of its own as Envoy's carry: time and
// allocations per request, and redis-server's CPU per request
// (redis-cpu-µs/op, from INFO cpu; coarse for short runs) and the benchmark
// process's own (cpu-µs/op, from getrusage: the stack and its callers). The
// parallel variants run GOMAXPROCS×8 callers, so that requests coalesce.
//
//	go test -run '^$' -bench ShouldRateLimitRedis -benchmem ./cmd/envoy-rls
func BenchmarkShouldRateLimitRedis(b *testing.B) {
	r := testenv.RedisServer(b)
	watcher, err := descriptors.NewWatcher(descriptors.WatcherOptions{Dir: benchConfigDir, Interval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	var o serveOptions
	newServeFlags(&o, io.Discard) // the defaults
	o.store.redisURL = "redis://" + r.Addr
	o.store.redisTimeout = time.Second
	st, err := openStore(context.Background(), o.store, log, m)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	svc, err := rls.New(rls.Options{Config: watcher, Limiter: st.limiter, Logger: log,
		Observer: rlsObserver{m: m, nearLimit: o.nearLimit}})
	if err != nil {
		b.Fatal(err)
	}
	// Requests over 100,000 indexes, built before the clock runs.
	const n = 100_000
	shapes := []struct {
		name, domain string
		descs        func(i int) []*commonrl.RateLimitDescriptor
	}{
		{"1desc", "bench", func(i int) []*commonrl.RateLimitDescriptor {
			return []*commonrl.RateLimitDescriptor{desc("remote_address", "10."+strconv.Itoa(i))}
		}},
		{"3desc", "bench", func(i int) []*commonrl.RateLimitDescriptor {
			return []*commonrl.RateLimitDescriptor{desc("remote_address", "10."+strconv.Itoa(i)),
				desc("tenant", "t"+strconv.Itoa(i%100), "user", "u"+strconv.Itoa(i)), desc("route", "/api/r"+strconv.Itoa(i%20))}
		}},
		{"4limits", "bench4", func(i int) []*commonrl.RateLimitDescriptor {
			return []*commonrl.RateLimitDescriptor{desc("remote_address", "10."+strconv.Itoa(i)),
				desc("plan", "p"+strconv.Itoa(i%10), "user", "u"+strconv.Itoa(i)), desc("route", "/api/r"+strconv.Itoa(i%20))}
		}},
	}
	for _, shape := range shapes {
		reqs := make([]*rlsv3.RateLimitRequest, n)
		for i := range reqs {
			reqs[i] = &rlsv3.RateLimitRequest{Domain: shape.domain, Descriptors: shape.descs(i)}
		}
		call := func(b *testing.B, i int) {
			// A deadline of its own, as gRPC gives the context of a
			// request that carries grpc-timeout (Envoy always sends one).
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			resp, err := svc.ShouldRateLimit(ctx, reqs[i%n])
			if err != nil {
				b.Fatal(err)
			}
			if resp.OverallCode != rlsv3.RateLimitResponse_OK {
				b.Fatalf("request %d: %v", i, resp.OverallCode)
			}
		}
		for _, parallel := range []bool{false, true} {
			name := shape.name
			if parallel {
				name += "/parallel"
			}
			b.Run(name, func(b *testing.B) {
				call(b, 0) // connect and load the library
				b.ReportAllocs()
				cpu, self := r.CPU(b), testenv.ProcessCPU(b)
				b.ResetTimer()
				if parallel {
					b.SetParallelism(8)
					var next atomic.Int64
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							call(b, int(next.Add(1)))
						}
					})
				} else {
					i := 0
					for b.Loop() {
						call(b, i)
						i++
					}
				}
				b.StopTimer()
				b.ReportMetric(float64((r.CPU(b)-cpu).Microseconds())/float64(b.N), "redis-cpu-µs/op")
				b.ReportMetric(float64((testenv.ProcessCPU(b)-self).Microseconds())/float64(b.N), "cpu-µs/op")
			})
		}
	}
}

// TestBenchConfigLoads: the limits `make bench` serves load, both domains.
func TestBenchConfigLoads(t *testing.T) {
	w, err := descriptors.NewWatcher(descriptors.WatcherOptions{Dir: benchConfigDir, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"bench", "bench4", "bench_fixed"} {
		if !w.Current().HasDomain(d) {
			t.Errorf("testdata/bench has no domain %s", d)
		}
	}
}
