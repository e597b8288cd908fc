package rls

import (
	"context"
	"strconv"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/envoy-rls/envoy-rls/pkg/memorybackend"
)

// benchYAML is the shape of the shipped edge config with limits no
// benchmark reaches: a per-IP limit and a tenant/user pair of limits, so one
// Envoy request of two descriptors makes three limiter requests.
const benchYAML = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {name: per_ip, unit: minute, requests_per_unit: 1000000000}
  - key: tenant
    descriptors:
      - key: user
        rate_limits:
          - {name: per_user_burst, algorithm: token_bucket, unit: second, requests_per_unit: 1000000000, burst: 1000000000}
          - {name: per_user_hourly, window: 1h, requests_per_unit: 1000000000}
`

func benchService(b *testing.B, files map[string]string) *Service {
	b.Helper()
	backend := memorybackend.New(memorybackend.Options{})
	b.Cleanup(func() { backend.Close() })
	svc, err := New(Options{Config: staticConfig{loadConfig(b, files)}, Limiter: backend})
	if err != nil {
		b.Fatal(err)
	}
	return svc
}

// reportCPU starts measuring the process's CPU time; the returned func
// reports it per operation as cpu-ns/op (garbage collection included).
func reportCPU(b *testing.B) func() {
	start := processCPU()
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
		}
	}
}

func benchRequests(n int) []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, n)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{
			desc("remote_address", "10.0.0."+strconv.Itoa(i%250)),
			desc("tenant", "acme", "user", "user-"+strconv.Itoa(i)),
		}}
	}
	return reqs
}

// BenchmarkShouldRateLimit measures the service's own path (validation,
// matching, one memory-backend Check of three limits, the response with
// headers and metadata), without gRPC:
//
//	go test -run '^$' -bench ShouldRateLimit -benchmem ./pkg/rls
func BenchmarkShouldRateLimit(b *testing.B) {
	svc := benchService(b, map[string]string{"edge.yaml": benchYAML})
	reqs := benchRequests(1024)
	ctx := context.Background()
	b.ReportAllocs()
	defer reportCPU(b)()
	i := 0
	for b.Loop() {
		resp, err := svc.ShouldRateLimit(ctx, reqs[i%len(reqs)])
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			b.Fatalf("%v %v", resp, err)
		}
		i++
	}
}

// BenchmarkShouldRateLimitOverLimit is the OVER_LIMIT path: Retry-After,
// the problem+json body.
func BenchmarkShouldRateLimitOverLimit(b *testing.B) {
	svc := benchService(b, map[string]string{"edge.yaml": `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {name: per_ip, unit: hour, requests_per_unit: 1}
`})
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", "10.0.0.1")}}
	ctx := context.Background()
	if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		resp, err := svc.ShouldRateLimit(ctx, req)
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			b.Fatalf("%v %v", resp, err)
		}
	}
}

// BenchmarkShouldRateLimitParallel runs the service path from GOMAXPROCS
// goroutines.
func BenchmarkShouldRateLimitParallel(b *testing.B) {
	svc := benchService(b, map[string]string{"edge.yaml": benchYAML})
	reqs := benchRequests(1024)
	b.ReportAllocs()
	defer reportCPU(b)()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		i := 0
		for pb.Next() {
			if _, err := svc.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}
