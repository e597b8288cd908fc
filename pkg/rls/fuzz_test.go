package rls

import (
	"context"
	"sync"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoy-rls/envoy-rls/pkg/memorybackend"
)

// FuzzShouldRateLimit feeds arbitrary wire bytes through the lenient decoder
// and the service: every input is either InvalidArgument or a response with
// one status per descriptor and an overall code of OK or OVER_LIMIT.
//
//	go test -run '^$' -fuzz FuzzShouldRateLimit ./pkg/rls
func FuzzShouldRateLimit(f *testing.F) {
	withHits := desc("user", "u")
	withHits.HitsAddend = wrapperspb.UInt64(0)
	for _, req := range []*rlsv3.RateLimitRequest{
		request("test", desc("user", "u")),
		request("test", desc("tenant", "a"), desc("tenant", "a", "plan", "gold"), withHits),
		request("test", desc("multi", "m"), desc("free", "x"), desc("shadowed", "s")),
		request("nope", desc("user", "u")),
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	backend := memorybackend.New(memorybackend.Options{SweepInterval: -1})
	defer backend.Close()
	svc, err := New(Options{Config: staticConfig{loadConfig(f, testFiles)}, Limiter: backend})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var in lenientRequest
		if err := in.Unmarshal(b); err != nil {
			t.Fatalf("Unmarshal failed: %v", err)
		}
		if in.err != nil {
			if status.Code(in.err) != codes.InvalidArgument {
				t.Fatalf("decode error %v is not InvalidArgument", in.err)
			}
			return
		}
		resp, err := svc.ShouldRateLimit(context.Background(), &in.req)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v is not InvalidArgument", err)
			}
			return
		}
		if c := resp.OverallCode; c != rlsv3.RateLimitResponse_OK && c != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("overall code %v", c)
		}
		if len(resp.Statuses) != len(in.req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(in.req.Descriptors))
		}
	})
}

// TestConcurrentRequestsAdmitExactlyTheLimit sends many requests for one
// counter at one instant from several goroutines over gRPC: exactly the
// limit is admitted.
func TestConcurrentRequestsAdmitExactlyTheLimit(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	l := limitOf(t, e.svc.cfg.Current(), "test", "per_user", "user", "u")
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		ok, bad int
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				resp, err := e.call(request("test", desc("user", "u")))
				mu.Lock()
				switch {
				case err != nil:
					t.Error(err)
				case resp.OverallCode == rlsv3.RateLimitResponse_OK:
					ok++
				default:
					bad++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if uint64(ok) != l.Limit.Requests || ok+bad != 40 {
		t.Errorf("%d admitted, %d denied; want %d admitted of 40", ok, bad, l.Limit.Requests)
	}
}
