package rls

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
	"github.com/envoy-rls/envoy-rls/pkg/memorybackend"
)

// t0 is the tests' starting instant: aligned to a day, so fixed windows of
// a second, minute, hour or day all start here.
var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// clock is the injected clock of the memory backend.
type clock struct{ ms atomic.Int64 }

func (c *clock) Now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *clock) Set(t time.Time)         { c.ms.Store(t.UnixMilli()) }
func (c *clock) Advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }
func (c *clock) Since0() time.Duration {
	return time.Duration(c.ms.Load()-t0.UnixMilli()) * time.Millisecond
}
func (c *clock) Elapsed(w time.Duration) time.Duration {
	return time.Duration(c.ms.Load()%w.Milliseconds()) * time.Millisecond
}

// staticConfig is a ConfigSource that always returns one config.
type staticConfig struct{ cfg *descriptors.Config }

func (s staticConfig) Current() *descriptors.Config { return s.cfg }

// recorder is an Observer that keeps what it is told.
type recorder struct {
	mu        sync.Mutex
	decisions []Decision
	unknown   []string
}

func (r *recorder) ObserveDecision(d Decision) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.decisions = append(r.decisions, d)
}

func (r *recorder) UnknownDomain(domain string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unknown = append(r.unknown, domain)
}

func (r *recorder) take() []Decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.decisions
	r.decisions = nil
	return d
}

// env is a real gRPC server on loopback serving a Service over the memory
// backend, and a client connected to it.
type env struct {
	t       *testing.T
	clock   *clock
	svc     *Service
	obs     *recorder
	logs    *testenv.Buffer
	conn    *grpc.ClientConn
	client  rlsv3.RateLimitServiceClient
	backend *memorybackend.Backend
}

// loadConfig writes files (name → YAML) to a temporary folder and loads it.
func loadConfig(t testing.TB, files map[string]string) *descriptors.Config {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := descriptors.Load(dir, descriptors.Options{})
	if err != nil {
		t.Fatalf("loading test config: %v", err)
	}
	return cfg
}

// newEnv starts a server for the YAML files with opts (Config, Limiter,
// Observer and Logger are filled in) and extra server options. The server
// uses the Codec and refuses a message over the Service's MaxRequestBytes,
// as serve's does.
func newEnv(t *testing.T, files map[string]string, opts Options, sopts ...grpc.ServerOption) *env {
	t.Helper()
	e := &env{t: t, clock: &clock{}, obs: &recorder{}, logs: &testenv.Buffer{}}
	e.clock.Set(t0)
	e.backend = memorybackend.New(memorybackend.Options{Now: e.clock.Now, SweepInterval: -1})
	t.Cleanup(func() { e.backend.Close() })
	if opts.Config == nil {
		opts.Config = staticConfig{loadConfig(t, files)}
	}
	if opts.Limiter == nil {
		opts.Limiter = e.backend
	}
	opts.Observer = e.obs
	opts.Logger = slog.New(slog.NewTextHandler(e.logs, nil))
	svc, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	e.svc = svc
	srv := grpc.NewServer(append([]grpc.ServerOption{grpc.ForceServerCodecV2(NewCodec()), grpc.MaxRecvMsgSize(svc.MaxRequestBytes())}, sopts...)...)
	svc.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		// A test that calls the service directly may stop the server
		// before the goroutine above reached Serve, which then returns
		// ErrServerStopped.
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.conn = conn
	e.client = rlsv3.NewRateLimitServiceClient(conn)
	return e
}

func (e *env) call(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return e.client.ShouldRateLimit(ctx, req)
}

// must sends req and fails the test on an error or an UNKNOWN code.
func (e *env) must(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	e.t.Helper()
	resp, err := e.call(req)
	if err != nil {
		e.t.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_UNKNOWN {
		e.t.Fatalf("overall code UNKNOWN for %v", req)
	}
	if len(resp.Statuses) != len(req.Descriptors) {
		e.t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
	}
	return resp
}

// rawMessage is a legacy-style proto message whose wire bytes are given, so
// a test can send what the standard encoder refuses (invalid UTF-8).
type rawMessage struct{ b []byte }

func (*rawMessage) Reset()                     {}
func (*rawMessage) String() string             { return "raw" }
func (*rawMessage) ProtoMessage()              {}
func (m *rawMessage) Marshal() ([]byte, error) { return m.b, nil }

func (e *env) callRaw(b []byte) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := new(rlsv3.RateLimitResponse)
	err := e.conn.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &rawMessage{b}, out)
	return out, err
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func request(domain string, ds ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

func header(resp *rlsv3.RateLimitResponse, name string) (string, bool) {
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == name {
			return h.Value, true
		}
	}
	return "", false
}

// metadataOf is Metadata(resp), failing the test on an error.
func metadataOf(t testing.TB, resp *rlsv3.RateLimitResponse) *structpb.Struct {
	t.Helper()
	md, err := Metadata(resp)
	if err != nil {
		t.Fatal(err)
	}
	return md
}

func errMessage(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return err.Error()
}
