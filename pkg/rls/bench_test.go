package rls

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
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
	start := testenv.ProcessCPU(b)
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(testenv.ProcessCPU(b)-start)/float64(b.N), "cpu-ns/op")
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

// overLimitService returns a Service whose one limit, per_ip, admits one
// request an hour, and a request for it.
func overLimitService(b *testing.B) (*Service, *rlsv3.RateLimitRequest) {
	svc := benchService(b, map[string]string{"edge.yaml": `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {name: per_ip, unit: hour, requests_per_unit: 1}
`})
	return svc, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", "10.0.0.1")}}
}

// BenchmarkShouldRateLimitOverLimit is the OVER_LIMIT path: Retry-After,
// the problem+json body.
func BenchmarkShouldRateLimitOverLimit(b *testing.B) {
	svc, req := overLimitService(b)
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

type namedCodec struct {
	name  string
	codec encoding.CodecV2
}

// benchCodecs are the server's Codec and gRPC's proto codec, which a
// server without grpc.ForceServerCodecV2 uses.
func benchCodecs() []namedCodec {
	return []namedCodec{{"codec=rls", NewCodec()}, {"codec=grpc", encoding.GetCodecV2(grpcproto.Name)}}
}

// wireBench drives the registered handler (shouldRateLimitHandler) as the
// gRPC server does, minus the transport: it decodes each request from its
// wire bytes into a lenientRequest, answers it, and encodes the response,
// with each of benchCodecs. want is every response's overall code.
func wireBench(b *testing.B, svc *Service, reqs []*rlsv3.RateLimitRequest, want rlsv3.RateLimitResponse_Code) {
	b.Helper()
	wire := make([]mem.BufferSlice, len(reqs))
	for i, req := range reqs {
		raw, err := proto.Marshal(req)
		if err != nil {
			b.Fatal(err)
		}
		wire[i] = mem.BufferSlice{mem.SliceBuffer(raw)}
	}
	for _, c := range benchCodecs() {
		b.Run(c.name, func(b *testing.B) {
			codec := c.codec
			ctx := context.Background()
			b.ReportAllocs()
			defer reportCPU(b)()
			i := 0
			for b.Loop() {
				data := wire[i%len(wire)]
				dec := func(v any) error { return codec.Unmarshal(data, v) }
				out, err := shouldRateLimitHandler(svc, ctx, dec, nil)
				if err != nil {
					b.Fatal(err)
				}
				if code := out.(*rlsv3.RateLimitResponse).OverallCode; code != want {
					b.Fatalf("overall code %v, want %v", code, want)
				}
				enc, err := codec.Marshal(out)
				if err != nil {
					b.Fatal(err)
				}
				enc.Free()
				i++
			}
		})
	}
}

// BenchmarkWireShouldRateLimit is BenchmarkShouldRateLimit from wire bytes
// to wire bytes: the request decoded through lenientRequest and the
// response encoded as on the server (see wireBench). Run it with the
// vtprotobuf build tag, as make builds the server, for the Codec's encoder:
//
//	go test -tags vtprotobuf -run '^$' -bench WireShouldRateLimit -benchmem -count 5 ./pkg/rls
func BenchmarkWireShouldRateLimit(b *testing.B) {
	svc := benchService(b, map[string]string{"edge.yaml": benchYAML})
	wireBench(b, svc, benchRequests(1024), rlsv3.RateLimitResponse_OK)
}

// BenchmarkWireShouldRateLimitOverLimit is BenchmarkShouldRateLimitOverLimit
// from wire bytes to wire bytes (see BenchmarkWireShouldRateLimit).
func BenchmarkWireShouldRateLimitOverLimit(b *testing.B) {
	svc, req := overLimitService(b)
	if _, err := svc.ShouldRateLimit(context.Background(), req); err != nil {
		b.Fatal(err)
	}
	wireBench(b, svc, []*rlsv3.RateLimitRequest{req}, rlsv3.RateLimitResponse_OVER_LIMIT)
}

// BenchmarkDecodeRequest compares decodeRequest with proto.Unmarshal on
// the requests of BenchmarkWireShouldRateLimit.
func BenchmarkDecodeRequest(b *testing.B) {
	reqs := benchRequests(1024)
	lim := RequestLimits{}.withDefaults()
	wire := make([][]byte, len(reqs))
	for i, req := range reqs {
		raw, err := proto.Marshal(req)
		if err != nil {
			b.Fatal(err)
		}
		wire[i] = raw
	}
	for _, c := range []struct {
		name   string
		decode func([]byte, *rlsv3.RateLimitRequest) bool
	}{
		{"decodeRequest", func(raw []byte, req *rlsv3.RateLimitRequest) bool {
			ok, err := decodeRequest(raw, &lim, req)
			return ok && err == nil
		}},
		{"proto.Unmarshal", func(raw []byte, req *rlsv3.RateLimitRequest) bool { return proto.Unmarshal(raw, req) == nil }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				var req rlsv3.RateLimitRequest
				if !c.decode(wire[i%len(wire)], &req) {
					b.Fatal("not decoded")
				}
				i++
			}
		})
	}
}

// BenchmarkEncodeResponse compares the Codec's encoding of a response (the
// one BenchmarkWireShouldRateLimit's first request gets) with gRPC's proto
// codec's. With the vtprotobuf tag the Codec uses the generated encoder:
//
//	go test -tags vtprotobuf -run '^$' -bench EncodeResponse -benchmem ./pkg/rls
func BenchmarkEncodeResponse(b *testing.B) {
	svc := benchService(b, map[string]string{"edge.yaml": benchYAML})
	resp, err := svc.ShouldRateLimit(context.Background(), benchRequests(1)[0])
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range benchCodecs() {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				enc, err := c.codec.Marshal(resp)
				if err != nil {
					b.Fatal(err)
				}
				enc.Free()
			}
		})
	}
}

// BenchmarkRespond builds the response to requests of one, three and four
// descriptors (metaCases: "ok", "three_descriptors_ok",
// "several_descriptors"), the part of ShouldRateLimit after the limiter:
//
//	go test -tags vtprotobuf -run '^$' -bench Respond -benchmem ./pkg/rls
func BenchmarkRespond(b *testing.B) {
	for _, c := range metaCases() {
		if c.name != "ok" && c.name != "three_descriptors_ok" && c.name != "several_descriptors" {
			continue
		}
		b.Run(fmt.Sprintf("%ddesc", len(c.limits)), func(b *testing.B) {
			svc := &Service{headers: c.mode}
			req, sc := c.scratch()
			b.ReportAllocs()
			for b.Loop() {
				sc.hdr, sc.hdrNames, sc.hdrEnds = sc.hdr[:0], sc.hdrNames[:0], sc.hdrEnds[:0]
				svc.respond(req, sc)
			}
		})
	}
}
