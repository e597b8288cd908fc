package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/envoy-rls/envoy-rls/internal/gcpercent"
	"github.com/envoy-rls/envoy-rls/internal/listen"
	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

// running is a serve() started by a test.
type running struct {
	addrs  boundAddrs
	hup    chan os.Signal
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
	// stop stops serve gracefully, at once; the test's end calls it too.
	stop func()
}

// startServe runs serve() on loopback with the given options (addresses
// are forced to free loopback ports, but for a unix: --grpc.addr) and stops
// it when the test ends.
func startServe(t *testing.T, o serveOptions) *running {
	t.Helper()
	return startServeLog(t, o, io.Discard)
}

// startServeLog is startServe with serve's log written to w (text).
func startServeLog(t *testing.T, o serveOptions, w io.Writer) *running {
	t.Helper()
	if !listen.IsUnix(o.grpcAddr) {
		o.grpcAddr = "127.0.0.1:0"
	}
	o.httpAddr, o.debugAddr = "127.0.0.1:0", "127.0.0.1:0"
	if o.headers == "" {
		o.headers = "ietf"
	}
	if o.drainTimeout == 0 {
		o.drainTimeout = 5 * time.Second
	}
	if o.reloadInterval == 0 {
		o.reloadInterval = time.Hour // tests reload through hup
	}
	if o.tlsCheckInterval == 0 {
		o.tlsCheckInterval = time.Hour // new connections, or hup, read the TLS files
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{hup: make(chan os.Signal, 1)}
	readyc := make(chan boundAddrs, 1)
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(w, nil))
	go func() { done <- serve(ctx, o, log, r.hup, func(a boundAddrs) { readyc <- a }) }()
	select {
	case r.addrs = <-readyc:
	case err := <-done:
		cancel()
		t.Fatalf("serve stopped before it was ready: %v", err)
	}
	conn, err := grpc.NewClient(r.addrs.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r.conn, r.client = conn, rlsv3.NewRateLimitServiceClient(conn)
	r.stop = sync.OnceFunc(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve returned %v after a graceful stop", err)
		}
	})
	t.Cleanup(r.stop)
	return r
}

// admitted sends n requests of one descriptor (kv: key, value, ...) in
// domain, one after the other, and returns how many were answered OK.
func (r *running) admitted(t *testing.T, n int, domain string, kv ...string) int {
	t.Helper()
	ok := 0
	for range n {
		resp, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
			Domain: domain, Descriptors: []*commonrl.RateLimitDescriptor{desc(kv...)}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil { // atomic, like a ConfigMap swap
		t.Fatal(err)
	}
}

func desc(kv ...string) *commonrl.RateLimitDescriptor {
	d := &commonrl.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonrl.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// TestServeRefusesRequestsOverMaxRequestBytes: serve's gRPC server refuses
// a request longer than the largest within the default request limits
// (1,322,569 bytes, rls.Service.MaxRequestBytes) with ResourceExhausted,
// where grpc-go's default would read up to 4 MiB, and answers one just
// within it (a long value is valid).
func TestServeRefusesRequestsOverMaxRequestBytes(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "t.yaml"), "domain: t\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")
	r := startServe(t, serveOptions{configDir: dir})
	for _, c := range []struct {
		value int
		want  codes.Code
	}{{1_322_569 - 20, codes.OK}, {1_322_569, codes.ResourceExhausted}} {
		req := &rlsv3.RateLimitRequest{Domain: "t", Descriptors: []*commonrl.RateLimitDescriptor{desc("k", strings.Repeat("v", c.value))}}
		if _, err := r.client.ShouldRateLimit(context.Background(), req); status.Code(err) != c.want {
			t.Errorf("a request of %d bytes: %v, want %v", proto.Size(req), err, c.want)
		}
	}
}

func TestServeHealthReadinessAndDecisions(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "t.yaml"), `
domain: t
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 2}
`)
	r := startServe(t, serveOptions{configDir: dir})

	hc := healthpb.NewHealthClient(r.conn)
	for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
		h, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health(%q) = %v, %v; want SERVING", svc, h, err)
		}
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get("http://" + r.addrs.HTTP + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d", path, resp.StatusCode)
		}
	}
	resp, err := http.Get("http://" + r.addrs.Debug + "/debug/config")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"domain t (", "  k ", "sliding_window", "2/1h0m0s", "fallback", "t.yaml:5:17"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/debug/config lacks %q:\n%s", want, body)
		}
	}

	var codes []rlsv3.RateLimitResponse_Code
	for range 3 {
		resp, err := r.client.ShouldRateLimit(context.Background(),
			&rlsv3.RateLimitRequest{Domain: "t", Descriptors: []*commonrl.RateLimitDescriptor{desc("k", "a")}})
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, resp.OverallCode)
	}
	want := []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}
	if fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Errorf("codes = %v, want %v", codes, want)
	}
}

func TestServeFailsOnBadConfigListingEveryError(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "bad.yaml"), "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: ''\n")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	err := serve(context.Background(), serveOptions{configDir: dir, headers: "ietf", grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0"}, log, nil, nil)
	if err == nil {
		t.Fatal("serve accepted a bad config")
	}
	for _, want := range []string{"bad.yaml:4:", "fortnight", "bad.yaml:5:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// TestReloadUnderLoad swaps the config 100 times while 32 callers hammer
// the service: no request fails, and decisions follow each new config.
func TestReloadUnderLoad(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "t.yaml")
	version := func(v int, extra string) string {
		return fmt.Sprintf(`
domain: t
descriptors:
  - key: ver
    rate_limit: {name: v%d, unit: hour, requests_per_unit: 1000000000}
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
%s`, v, extra)
	}
	writeFile(t, file, version(0, ""))
	r := startServe(t, serveOptions{configDir: dir})

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	for c := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &rlsv3.RateLimitRequest{Domain: "t", Descriptors: []*commonrl.RateLimitDescriptor{
				desc("ver", "x"), desc("k", fmt.Sprint(c))}}
			for ctx.Err() == nil {
				resp, err := r.client.ShouldRateLimit(context.Background(), req)
				sent.Add(1)
				if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OK {
					err = fmt.Errorf("overall code %v", resp.OverallCode)
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	// currentVersion asks the service which config version answers.
	currentVersion := func() string {
		resp, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
			Domain: "t", Descriptors: []*commonrl.RateLimitDescriptor{desc("ver", "probe")}, HitsAddend: 0})
		if err != nil || len(resp.Statuses) != 1 || resp.Statuses[0].CurrentLimit == nil {
			t.Fatalf("probe: %v %v", resp, err)
		}
		return resp.Statuses[0].CurrentLimit.Name
	}
	awaitVersion := func(v int) {
		want := fmt.Sprintf("v%d", v)
		for i := 0; currentVersion() != want; i++ {
			if i > 100000 {
				t.Fatalf("config version %s never became active", want)
			}
		}
	}
	for v := 1; v <= 100; v++ {
		extra := ""
		if v == 100 {
			extra = "  - key: final\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"
		}
		writeFile(t, file, version(v, extra))
		r.hup <- os.Interrupt // any signal value: serve reloads on every receive
		awaitVersion(v)
	}
	stop()
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of %d requests failed during reloads; first: %v", failed.Load(), sent.Load(), firstErr.Load())
	}
	if sent.Load() < 32 {
		t.Fatalf("only %d requests sent", sent.Load())
	}

	// The last config's new rule is enforced exactly, from 32 callers at once.
	var admitted atomic.Int64
	var wg2 sync.WaitGroup
	for range 32 {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			resp, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
				Domain: "t", Descriptors: []*commonrl.RateLimitDescriptor{desc("final", "a")}})
			if err != nil {
				t.Error(err)
				return
			}
			if resp.OverallCode == rlsv3.RateLimitResponse_OK {
				admitted.Add(1)
			}
		}()
	}
	wg2.Wait()
	if admitted.Load() != 5 {
		t.Errorf("admitted %d under the new 5/hour limit, want exactly 5", admitted.Load())
	}
}

// TestGCPercent: --runtime.gc-percent sets GOGC (its default too) unless the
// GOGC variable is set and the flag was not given; a flag given on the
// command line or in ENVOY_RLS_RUNTIME_GC_PERCENT wins over GOGC. (Values
// below 1 are refused by parseServeFlags: TestServeFlagsOutOfRange.)
func TestGCPercent(t *testing.T) {
	cases := []struct {
		name     string
		args     []string
		env      map[string]string
		wantSet  int // 0: not set
		wantGOGC string
	}{
		{name: "default", wantSet: gcpercent.Default, wantGOGC: strconv.Itoa(gcpercent.Default)},
		{name: "flag", args: []string{"--runtime.gc-percent", "250"}, wantSet: 250, wantGOGC: "250"},
		{name: "GOGC", env: map[string]string{"GOGC": "150"}, wantGOGC: "150"},
		{name: "flag over GOGC", args: []string{"--runtime.gc-percent", "300"}, env: map[string]string{"GOGC": "150"}, wantSet: 300, wantGOGC: "300"},
		{name: "variable over GOGC", env: map[string]string{"GOGC": "150", "ENVOY_RLS_RUNTIME_GC_PERCENT": "350"}, wantSet: 350, wantGOGC: "350"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			o, err := parseServeFlags(tc.args, io.Discard, lookup)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			set := 0
			gogc, from := o.gc.Apply(lookup, func(p int) int { set = p; return 100 })
			if set != tc.wantSet || gogc != tc.wantGOGC || from == "" {
				t.Errorf("set %d, GOGC %q from %q; want set %d, GOGC %q", set, gogc, from, tc.wantSet, tc.wantGOGC)
			}
		})
	}
}

// TestServeOnUnixSocket: with a unix: --grpc.addr serve answers on that
// socket, made with --grpc.socket-mode; it reports the address as a gRPC
// target; and a graceful stop removes the socket file.
func TestServeOnUnixSocket(t *testing.T) {
	path := testenv.SocketPath(t, "grpc.sock")
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "u.yaml"), "domain: u\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n")
	o := serveOptions{configDir: dir, grpcAddr: "unix:" + path, grpcMode: 0o600}
	r := startServe(t, o)
	if r.addrs.GRPC != "unix:"+path {
		t.Errorf("bound gRPC address %q, want unix:%s", r.addrs.GRPC, path)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v (%v), want a socket with mode 0600", path, fi, err)
	}
	if ok := r.admitted(t, 5, "u", "k", "v"); ok != 3 {
		t.Errorf("admitted %d of 5 under a limit of 3", ok)
	}
	r.stop()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("after a graceful stop, %s: %v; want it removed", path, err)
	}
}

// TestServeRejectsBadFlags: serve refuses, with the flags' names, before it
// listens or connects, a --redis.tls.key without its certificate and TLS
// for a Redis on a Unix socket (which Redis serves without TLS). (Values
// out of their range are refused earlier, by parseServeFlags:
// TestServeFlagsOutOfRange.)
func TestServeRejectsBadFlags(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "ok.yaml"), "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name string
		set  func(*storeOptions)
		want []string
	}{
		{"key without certificate", func(s *storeOptions) {
			s.redisURL = "redis://127.0.0.1:1"
			s.redisTLS.Key = "client.key" // without --redis.tls.cert: was ignored
		}, []string{"--redis.tls"}},
		{"TLS on a Unix socket", func(s *storeOptions) {
			s.redisURL = "unix:///run/redis/redis.sock"
			s.redisTLS.Insecure = true
		}, []string{"--redis.url /run/redis/redis.sock is a Unix socket", "--redis.tls"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := serveOptions{configDir: dir, headers: "ietf", grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0"}
			tc.set(&o.store)
			// A bound, not synchronisation: a flag accepted by mistake
			// would serve until the context ends.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := serve(ctx, o, log, nil, nil)
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("serve: %v, want an error with %q", err, w)
				}
			}
		})
	}
}

// TestStopEndsHealthWatches: a graceful stop with a health Watch stream
// open (a probe, grpcurl, a mesh sidecar) sends the watcher NOT_SERVING and
// ends its stream, so the stop completes with the in-flight requests, not
// after the drain timeout (an hour here) with a hard Stop. Before, the open
// stream held GracefulStop for the whole drain timeout.
func TestStopEndsHealthWatches(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "t.yaml"), "domain: t\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")
	o := serveOptions{configDir: dir, headers: "ietf", grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0",
		drainTimeout: time.Hour, reloadInterval: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	readyc := make(chan boundAddrs, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, o, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, func(a boundAddrs) { readyc <- a })
	}()
	var addrs boundAddrs
	select {
	case addrs = <-readyc:
	case err := <-done:
		t.Fatalf("serve stopped before it was ready: %v", err)
	}
	conn, err := grpc.NewClient(addrs.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second) // a hang guard
	defer wcancel()
	watch, err := healthpb.NewHealthClient(conn).Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if h, err := watch.Recv(); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first Watch answer %v, %v; want SERVING", h, err)
	}
	cancel()
	sawNotServing := false
	for {
		h, err := watch.Recv()
		if err != nil {
			if wctx.Err() != nil {
				t.Fatal("the Watch stream stayed open after the stop began")
			}
			break // the server ended the stream
		}
		if h.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("Watch answer while stopping: %v, want NOT_SERVING", h.Status)
		}
		sawNotServing = true
	}
	if !sawNotServing {
		t.Error("the Watch stream ended without a NOT_SERVING answer")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve returned %v", err)
		}
	case <-time.After(30 * time.Second): // a hang guard; the drain timeout is an hour
		t.Fatal("serve did not stop: the open Watch stream holds the graceful stop")
	}
}

// TestStopDuringStart: a stop that arrives while serve is still starting (a
// SIGTERM during the configuration's load) is as clean as any other: serve
// returns nil. The gRPC server, stopped before its Serve began, made Serve
// return grpc.ErrServerStopped, which serve reported as its failure (exit
// 1) in about half of such stops (a review's finding).
func TestStopDuringStart(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "t.yaml"), "domain: t\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")
	o := serveOptions{configDir: dir, headers: "ietf", grpcAddr: "127.0.0.1:0", httpAddr: "127.0.0.1:0",
		drainTimeout: time.Minute, reloadInterval: time.Hour}
	o.debug.topCapacity = 64
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := serve(ctx, o, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil); err != nil {
			t.Fatalf("stop %d, during the start: %v", i, err)
		}
	}
}

// TestUnknownDomainLinesBounded: a client cycling through more unknown
// domains than are remembered (1,000) costs one line for each of the first
// 1,000 and summarised lines for the rest, not a line per request: the
// remembered set was cleared when full, and 3,003 requests over 1,001
// domains wrote 3,003 lines (a review's finding).
func TestUnknownDomainLinesBounded(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "c.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	var log testenv.Buffer
	r := startServeLog(t, serveOptions{configDir: dir, logRepeat: time.Hour}, &log)
	const domains, rounds = 1001, 3
	for range rounds {
		for i := range domains {
			_, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
				Domain: fmt.Sprintf("tenant-%04d", i), Descriptors: []*commonrl.RateLimitDescriptor{desc("k", "v")}})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	r.stop() // flushes the summarised lines
	var once, summarised int
	for line := range strings.Lines(log.String()) {
		switch {
		case strings.Contains(line, "more unknown domains than are remembered"):
			summarised++
			if strings.Contains(line, "suppressed=") && !strings.Contains(line, "suppressed=2") {
				t.Errorf("summary %q: want suppressed=2 (the 1,001st domain's 2 later requests)", line)
			}
		case strings.Contains(line, "request for an unknown domain"):
			once++
		}
	}
	if once != 1000 || summarised < 1 || summarised > 2 {
		t.Errorf("%d requests over %d unknown domains: %d lines naming a domain once, %d summarised; want 1000 and 1 or 2", domains*rounds, domains, once, summarised)
	}
}
