package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/envoy-rls/envoy-rls/internal/listen"
	"github.com/envoy-rls/envoy-rls/pkg/rls"
)

// NoopServer is a RateLimitService v3 server that does no work: it answers
// every ShouldRateLimit with overall code OK and one OK status per request
// descriptor. Its throughput is the ceiling that the gRPC stack, the loopback
// network and the load generator allow on this machine; a real server's rate
// divided by it shows what the limiting itself costs.
//
// It also serves the standard gRPC health service (SERVING), so scripts can
// wait for it. A NoopServer is safe for concurrent use; Close stops it.
type NoopServer struct {
	srv  *grpc.Server
	lis  net.Listener
	done chan struct{}
	err  error // result of Serve, read after done is closed

	closeOnce sync.Once
}

// noopConnWindow is the do-nothing server's fixed connection window, envoy-rls's
// default.
const noopConnWindow = 1 << 20

// NoopOption configures a NoopServer (StartNoop).
type NoopOption func(*noopConfig)

type noopConfig struct {
	tls *tls.Config
}

// NoopTLS serves TLS with cfg, a server's configuration (e.g. a
// tlsfiles.Server's Config()), instead of plain text. gRPC's
// credentials.NewTLS adds HTTP/2's ALPN name to it.
func NoopTLS(cfg *tls.Config) NoopOption {
	return func(c *noopConfig) { c.tls = cfg }
}

// StartNoop listens on addr ("127.0.0.1:0" picks a free loopback port;
// "unix:/path" a Unix socket) and serves in a goroutine owned by the
// returned server until Close; plain text unless NoopTLS is given.
func StartNoop(addr string, opts ...NoopOption) (*NoopServer, error) {
	var c noopConfig
	for _, o := range opts {
		o(&c)
	}
	lis, err := listen.Listen(context.Background(), addr, listen.DefaultMode)
	if err != nil {
		return nil, fmt.Errorf("noop server: listen on %s: %w", addr, err)
	}
	// A fixed connection window, as envoy-rls keeps by default
	// (--grpc.conn-window): without it grpc-go sends a BDP PING on most
	// requests, and the ceiling would pay a cost envoy-rls does not.
	// envoy-rls's codec, for the same reason: built with -tags vtprotobuf
	// (as make bench builds it), it encodes the responses without
	// reflection, as envoy-rls does. The requests are decoded by gRPC's
	// codec, about 0.35 µs more per request of three descriptors than
	// envoy-rls's decoder.
	serverOpts := []grpc.ServerOption{grpc.StaticConnWindowSize(noopConnWindow), grpc.ForceServerCodecV2(rls.NewCodec())}
	if c.tls != nil {
		serverOpts = append(serverOpts, grpc.Creds(credentials.NewTLS(c.tls)))
	}
	srv := grpc.NewServer(serverOpts...)
	s := &NoopServer{srv: srv, lis: lis, done: make(chan struct{})}
	rlsv3.RegisterRateLimitServiceServer(s.srv, noopService{})
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s.srv, hs)
	// Reflection lets other tools (grpcurl, ghz) call it without .proto
	// files, so it can be the ceiling of their runs too.
	reflection.Register(s.srv)
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.err = fmt.Errorf("noop server: serve: %w", err)
		}
	}()
	return s, nil
}

// Addr returns the address the server listens on as a gRPC target:
// host:port, or unix:/path.
func (s *NoopServer) Addr() string { return listen.Target(s.lis.Addr()) }

// Done is closed when the server has stopped serving.
func (s *NoopServer) Done() <-chan struct{} { return s.done }

// Close stops the server at once (in-flight calls are cancelled), waits for
// its goroutine and returns the error that ended serving, if any other than
// the stop itself.
func (s *NoopServer) Close() error {
	s.closeOnce.Do(s.srv.Stop)
	<-s.done
	return s.err
}

type noopService struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (noopService) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	n := len(req.GetDescriptors())
	statuses := make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
	backing := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	for i := range statuses {
		backing[i].Code = rlsv3.RateLimitResponse_OK
		statuses[i] = &backing[i]
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: statuses}, nil
}
