package main

import (
	"context"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// healthService is gRPC health whose Watch streams end when the server
// stops. grpc-go's health.Server sends NOT_SERVING to its watchers on
// Shutdown but keeps their streams open, and GracefulStop waits for every
// open stream: one watcher (a probe, grpcurl, a mesh sidecar) held every
// stop for the whole --shutdown.drain-timeout, then a hard Stop cut the
// requests still in flight.
type healthService struct {
	*health.Server
	stopping context.Context // ends when the server stops
	stop     context.CancelFunc
}

func newHealthService() *healthService {
	ctx, cancel := context.WithCancel(context.Background())
	return &healthService{Server: health.NewServer(), stopping: ctx, stop: cancel}
}

// Shutdown sets every service NOT_SERVING, which the watchers are sent,
// then ends their streams.
func (h *healthService) Shutdown() {
	h.Server.Shutdown()
	h.stop()
}

// Watch is health.Server's Watch on a stream whose context also ends with
// the server.
func (h *healthService) Watch(in *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	defer context.AfterFunc(h.stopping, cancel)()
	return h.Server.Watch(in, stoppableStream{stream, ctx})
}

// stoppableStream is a Watch stream with the context Watch gave it.
type stoppableStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (s stoppableStream) Context() context.Context { return s.ctx }
