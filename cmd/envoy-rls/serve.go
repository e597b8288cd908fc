package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/envoy-rls/envoy-rls/internal/gcpercent"
	"github.com/envoy-rls/envoy-rls/internal/listen"
	"github.com/envoy-rls/envoy-rls/internal/logevery"
	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
	"github.com/envoy-rls/envoy-rls/pkg/metrics"
	"github.com/envoy-rls/envoy-rls/pkg/redisbackend"
	"github.com/envoy-rls/envoy-rls/pkg/rls"
)

// serveOptions holds every serve flag.
type serveOptions struct {
	configDir      string
	mergeDomains   bool
	reloadInterval time.Duration
	// tlsCheckInterval is how often the TLS files are read between
	// connections.
	tlsCheckInterval time.Duration
	grpcAddr         string
	grpcMode         listen.Mode
	grpcWorkers      int
	grpcWindow       int
	grpcTLS          tlsfiles.ServerFiles
	httpAddr         string
	debugAddr        string
	headers          string
	shadow           bool
	logLevel         string
	logFormat        string
	// logRepeat bounds the log lines that can come once per request or
	// connection: one line of each kind per interval.
	logRepeat    time.Duration
	drainTimeout time.Duration
	nearLimit    float64
	gc           *gcpercent.Flag
	store        storeOptions
	debug        debugOptions
}

func newServeFlags(o *serveOptions, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.configDir, "config.dir", "./config", "folder of descriptor YAML files, one domain per file")
	fs.BoolVar(&o.mergeDomains, "config.merge-domains", false, "allow several files to declare the same domain (their descriptors are merged)")
	fs.DurationVar(&o.reloadInterval, "config.reload-interval", 5*time.Second, "how often the config folder is checked for changes (SIGHUP reloads at once)")
	fs.DurationVar(&o.tlsCheckInterval, "tls.check-interval", time.Minute, "how often the --grpc.tls.* and --redis.tls.* files are read between connections (each new connection reads them too), so that a renewal is loaded, logged and its expiry exported while no connection opens (SIGHUP reads them at once)")
	fs.StringVar(&o.grpcAddr, "grpc.addr", ":8081", "gRPC listen address (RateLimitService v3, health, reflection): host:port, or unix:/path/to/socket for clients on this host (Envoy: a pipe address)")
	o.grpcMode = listen.Mode(listen.DefaultMode)
	fs.Var(&o.grpcMode, "grpc.socket-mode", "permission of the unix: --grpc.addr socket, in octal: who on this host may connect (0660 with a group shared with Envoy restricts it to them)")
	fs.IntVar(&o.grpcWorkers, "grpc.stream-workers", 64, "goroutines kept to serve gRPC calls (more concurrent calls get a goroutine each); reusing them spares a goroutine start and stack growth per call; 0 starts one per call")
	fs.IntVar(&o.grpcWindow, "grpc.conn-window", defaultConnWindow, "fixed HTTP/2 flow-control window of each gRPC connection, in bytes (65535 or more): a fixed window spares the BDP ping grpc-go otherwise sends, and the client answers, for most requests; 0 lets grpc-go size the windows by BDP estimation")
	o.grpcTLS.Register(fs, "grpc.tls.")
	fs.StringVar(&o.httpAddr, "http.addr", ":9090", "HTTP listen address (/metrics, /healthz, /readyz)")
	fs.StringVar(&o.debugAddr, "debug.addr", "127.0.0.1:6070", "debug listen address (pprof, /debug/config, /debug/explain, /debug/top); empty disables it")
	fs.StringVar(&o.headers, "headers", "ietf", "rate-limit response headers: ietf (RateLimit-Policy, RateLimit), draft03 (X-RateLimit-*), none")
	fs.BoolVar(&o.shadow, "shadow", false, "shadow mode for every rule: count and report, never deny")
	fs.StringVar(&o.logLevel, "log.level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&o.logFormat, "log.format", "text", "log format: text or json")
	fs.DurationVar(&o.logRepeat, "log.repeat-interval", 10*time.Second, "the lines that can come once per request or connection (a failed check, a failed TLS handshake, go-redis's warnings) are written once per interval for each kind, the next one saying how many were held back (suppressed=N), and a kind that falls quiet is reported at the end of its interval and at stop; 0 writes every line")
	fs.Float64Var(&o.nearLimit, "metrics.near-limit-ratio", 0.8, "used fraction of a limit from which an admitted request counts in envoy_rls_near_limit_total (0 disables it)")
	fs.DurationVar(&o.drainTimeout, "shutdown.drain-timeout", 10*time.Second, "how long a graceful stop waits for in-flight requests")
	o.gc = gcpercent.New(fs, "runtime.gc-percent", "the Go garbage collector's GOGC: heap growth, in percent of the live heap, that starts a collection (1 or more); when the GOGC variable is set and this flag is not given, GOGC applies")
	o.store.register(fs)
	o.debug.register(fs)
	fs.Usage = usageWithEnv(fs, "envoy-rls [serve] [flags]")
	return fs
}

func parseServeFlags(args []string, stderr io.Writer, lookupEnv func(string) (string, bool)) (serveOptions, error) {
	var o serveOptions
	fs := newServeFlags(&o, stderr)
	if err := fs.Parse(args); err != nil {
		return o, parseError(err)
	}
	if fs.NArg() > 0 {
		return o, usageError{msg: fmt.Sprintf("serve takes no arguments, got %q", fs.Args())}
	}
	if err := applyEnv(fs, lookupEnv); err != nil {
		return o, usageError{msg: err.Error()}
	}
	var redisGiven []string
	modeGiven := false
	fs.Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "redis.") {
			redisGiven = append(redisGiven, "--"+f.Name)
		}
		modeGiven = modeGiven || f.Name == "grpc.socket-mode"
	})
	if err := o.checkRanges(); err != nil {
		return o, err
	}
	if err := o.grpcTLS.CheckFlags("grpc.tls."); err != nil {
		return o, usageError{msg: err.Error()}
	}
	if listen.IsUnix(o.grpcAddr) {
		if _, err := listen.UnixPath(o.grpcAddr); err != nil {
			return o, usageError{msg: "--grpc.addr: " + err.Error()}
		}
	} else if modeGiven {
		return o, usageError{msg: fmt.Sprintf("--grpc.socket-mode is set, but --grpc.addr %s is no Unix socket (unix:/path)", o.grpcAddr)}
	}
	if len(redisGiven) > 0 && !o.store.redisConfigured() {
		// Counting in memory would multiply every limit by the number of
		// instances: refuse rather than drop what was meant for Redis.
		return o, usageError{msg: fmt.Sprintf("%s set, but no Redis to connect to: set --redis.url, --redis.cluster-addrs or --redis.sentinel-addrs (or leave every --redis.* flag out to count in memory)",
			strings.Join(redisGiven, ", "))}
	}
	if o.store.redisConfigured() {
		// What the backend would refuse once started (two topologies, a
		// Sentinel without its master, …) is a usage error.
		if err := o.store.redisOptions().Check(); err != nil {
			return o, usageError{msg: err.Error()}
		}
	}
	return o, nil
}

// checkRanges refuses a flag value outside its documented range with the
// flag's name, before anything listens or connects: where the packages
// would quietly take their default instead (a zero or negative interval,
// capacity or timeout), drop a bound (a negative --redis.timeout or
// --deny-cache.max-ttl) or ignore the value (a small --grpc.conn-window).
func (o serveOptions) checkRanges() error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"config.reload-interval", o.reloadInterval},
		{"tls.check-interval", o.tlsCheckInterval},
		{"redis.timeout", o.store.redisTimeout},
		{"deny-cache.max-ttl", o.store.denyCacheMaxTTL},
	} {
		if d.v <= 0 {
			return usageError{msg: fmt.Sprintf("--%s %v: must be positive", d.flag, d.v)}
		}
	}
	switch {
	case o.grpcWorkers < 0 || o.grpcWorkers > maxStreamWorkers:
		return usageError{msg: fmt.Sprintf("--grpc.stream-workers %d: must be from 0 to %d", o.grpcWorkers, maxStreamWorkers)}
	case o.store.redisSenders == 0 || o.store.redisSenders < -1:
		// The backend would take 0 for its default and any negative for off.
		return usageError{msg: fmt.Sprintf("--redis.senders %d: must be -1 (off) or 1 or more", o.store.redisSenders)}
	case o.store.redisKeyPrefix == "":
		// The backend would take its default, rls:, for it.
		return usageError{msg: `--redis.key-prefix "": must not be empty (the default is rls:)`}
	case o.store.redisMaxBatch < 1:
		return usageError{msg: fmt.Sprintf("--redis.max-batch %d: must be 1 or more", o.store.redisMaxBatch)}
	case o.grpcWindow != 0 && (o.grpcWindow < 65535 || o.grpcWindow > math.MaxInt32):
		// grpc-go ignores a window below HTTP/2's initial 65535 bytes
		// without a word: refuse it instead.
		return usageError{msg: fmt.Sprintf("--grpc.conn-window %d: must be 0 or from 65535 to %d bytes", o.grpcWindow, math.MaxInt32)}
	case o.store.redisSpareAfter < 0:
		return usageError{msg: fmt.Sprintf("--redis.spare-after %v: must be 0 or more", o.store.redisSpareAfter)}
	case o.logRepeat < 0:
		return usageError{msg: fmt.Sprintf("--log.repeat-interval %v: must be 0 (every line) or more", o.logRepeat)}
	case o.drainTimeout < 0:
		return usageError{msg: fmt.Sprintf("--shutdown.drain-timeout %v: must be 0 (stop at once) or more", o.drainTimeout)}
	case o.debug.topCapacity < 1:
		return usageError{msg: fmt.Sprintf("--debug.top-capacity %d: must be 1 or more", o.debug.topCapacity)}
	case !(o.nearLimit >= 0 && o.nearLimit <= 1): // NaN too
		return usageError{msg: fmt.Sprintf("--metrics.near-limit-ratio %v: must be from 0 (off) to 1", o.nearLimit)}
	case o.store.denyCacheEntries < 0:
		return usageError{msg: fmt.Sprintf("--deny-cache.max-entries %d: must be 0 (off) or more", o.store.denyCacheEntries)}
	case o.store.fallbackInstances < 0:
		return usageError{msg: fmt.Sprintf("--fallback.instances %d: must be 0 (learn) or more", o.store.fallbackInstances)}
	}
	if err := o.gc.Check(); err != nil {
		return usageError{msg: err.Error()}
	}
	return nil
}

// maxStreamWorkers bounds --grpc.stream-workers: grpc-go starts them all
// at once, and a call beyond them gets a goroutine of its own anyway.
const maxStreamWorkers = 16384

// defaultConnWindow is --grpc.conn-window's default, 1 MiB: a rate-limit
// request is a few hundred bytes, so the window is replenished once every few
// thousand requests. With a dynamic window (0) grpc-go estimates the
// bandwidth-delay product by sending a PING whenever data arrives and no
// PING is in flight: nearly one per request at a moderate rate, which the
// client must answer (docs/performance.md, "What made the difference").
const defaultConnWindow = 1 << 20

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	switch strings.ToLower(level) {
	case "debug", "info", "warn", "error":
		// UnmarshalText alone also takes offsets such as error+8, which
		// would hide every line.
		if err := lv.UnmarshalText([]byte(level)); err != nil {
			return nil, fmt.Errorf("--log.level: %w", err)
		}
	default:
		return nil, fmt.Errorf("--log.level %q: want debug, info, warn or error", level)
	}
	ho := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, ho)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, ho)), nil
	}
	return nil, fmt.Errorf("--log.format: %q is not text or json", format)
}

func serveMain(ctx context.Context, args []string, stderr io.Writer, lookupEnv func(string) (string, bool)) error {
	o, err := parseServeFlags(args, stderr, lookupEnv)
	if err != nil {
		return err
	}
	log, err := newLogger(stderr, o.logLevel, o.logFormat)
	if err != nil {
		return usageError{msg: err.Error()}
	}
	// The flag counts as given from its ENVOY_RLS_ variable too.
	gogc, from := o.gc.Apply(lookupEnv, debug.SetGCPercent)
	log.Info("garbage collector", "gogc", gogc, "from", from)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	return serve(ctx, o, log, hup, nil)
}

// server is one running envoy-rls: its listeners, config and store.
type server struct {
	log *slog.Logger
	// lines bounds the lines that can come once per request or
	// connection; run flushes it once per interval.
	lines   *logevery.Limiter
	watcher *descriptors.Watcher
	store   *store
	health  *healthService
	grpc    *grpc.Server
	http    *http.Server
	debug   *http.Server
	reg     *prometheus.Registry
	dbg     *debugTools
	// tlsChecks read the TLS files (the gRPC listener's, Redis's), each
	// loading a change as a new connection would.
	tlsChecks []func()
}

// checkTLS reads every set of TLS files now.
func (s *server) checkTLS() {
	for _, check := range s.tlsChecks {
		check()
	}
}

// serve runs the service until ctx ends, then stops gracefully. hup
// triggers config reloads (and reads the TLS files). ready, when not nil,
// is called with the bound addresses once every listener accepts
// connections (tests use it).
func serve(ctx context.Context, o serveOptions, log *slog.Logger, hup <-chan os.Signal, ready func(addrs boundAddrs)) error {
	headers, err := rls.ParseHeaderMode(o.headers)
	if err != nil {
		return usageError{msg: "--headers: " + err.Error()}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := metrics.New(reg)
	if err != nil {
		return err
	}
	// One bound for every line that can come once per request or
	// connection, flushed by run once per interval and here at the end.
	lines := logevery.New(o.logRepeat, nil)
	// go-redis has one logger per process, and a process one serve (tests
	// run theirs one after another).
	redisbackend.SetClientLogger(log, lines)
	defer redisbackend.SetClientLogger(nil, nil)
	defer lines.FlushAll(context.Background())
	// The listener's certificate is read before anything connects, so
	// that a missing file stops the start at once.
	creds, checkGRPCTLS, err := grpcServerTLS(o.grpcTLS, log, lines, m)
	if err != nil {
		return err
	}

	watcher, err := descriptors.NewWatcher(descriptors.WatcherOptions{
		Dir:      o.configDir,
		Load:     descriptors.Options{MergeDomains: o.mergeDomains},
		Interval: o.reloadInterval,
		Logger:   log,
		OnReload: func(ev descriptors.ReloadEvent) { recordReload(m, ev) },
	})
	if err != nil {
		return fmt.Errorf("loading %s: %w", o.configDir, err)
	}
	for _, d := range watcher.Current().Domains() {
		log.Info("domain loaded", "domain", d.Domain, "rules", d.Rules, "limits", d.Limits, "file", d.File)
	}

	st, err := openStore(ctx, o.store, log, m)
	if err != nil {
		return err
	}
	defer st.Close()

	dbg := newDebugTools(o.debug, time.Now)
	svc, err := rls.New(rls.Options{
		Config:   watcher,
		Limiter:  st.limiter,
		Headers:  headers,
		Shadow:   o.shadow,
		Logger:   log,
		Lines:    lines,
		Observer: dbg.observer(rlsObserver{m: m, nearLimit: o.nearLimit}),
	})
	if err != nil {
		return err
	}
	dbg.setService(svc)

	s := &server{log: log, lines: lines, watcher: watcher, store: st, reg: reg, health: newHealthService(), dbg: dbg}
	for _, check := range []func(){checkGRPCTLS, st.checkTLS} {
		if check != nil {
			s.tlsChecks = append(s.tlsChecks, check)
		}
	}
	grpcOpts := []grpc.ServerOption{
		// Decodes requests and encodes responses without the protobuf
		// runtime's reflection (see rls.Codec).
		grpc.ForceServerCodecV2(rls.NewCodec()),
		// A request longer than the largest within the request limits
		// (about 1.3 MB) is refused, ResourceExhausted, by its length
		// prefix, before it is read, instead of at grpc-go's default of
		// 4 MiB.
		grpc.MaxRecvMsgSize(svc.MaxRequestBytes()),
		// Envoy keeps few long-lived HTTP/2 connections and multiplexes
		// many small unary calls on them.
		grpc.MaxConcurrentStreams(1 << 16),
		grpc.NumStreamWorkers(uint32(o.grpcWorkers)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.ChainUnaryInterceptor(requestMetrics(m, time.Now)),
	}
	if o.grpcWindow > 0 {
		// A fixed connection window, and streams at HTTP/2's initial 64 KiB.
		grpcOpts = append(grpcOpts, grpc.StaticConnWindowSize(int32(o.grpcWindow)))
	}
	if creds != nil {
		grpcOpts = append(grpcOpts, creds)
	}
	s.grpc = grpc.NewServer(grpcOpts...)
	svc.Register(s.grpc)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	// The config is loaded (the watcher's constructor failed otherwise):
	// the service and the overall health are SERVING.
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus("envoy.service.ratelimit.v3.RateLimitService", healthpb.HealthCheckResponse_SERVING)

	// net/http's own lines (an accept error, a handler's panic) through
	// the service's logger too, not the standard library's default one.
	httpLog := slog.NewLogLogger(log.With("component", "http").Handler(), slog.LevelWarn)
	s.http = newHTTPServer(s.httpMux(), httpLog)
	if o.debugAddr != "" {
		s.debug = newHTTPServer(s.debugMux(), httpLog)
	}
	return s.run(ctx, o, hup, ready)
}

// boundAddrs are the addresses the listeners actually bound (ports may be 0
// in flags).
type boundAddrs struct{ GRPC, HTTP, Debug string }

func (s *server) run(ctx context.Context, o serveOptions, hup <-chan os.Signal, ready func(boundAddrs)) error {
	var lc net.ListenConfig
	gl, err := listen.Listen(ctx, o.grpcAddr, o.grpcMode.FileMode())
	if err != nil {
		return fmt.Errorf("--grpc.addr: %w", err)
	}
	hl, err := lc.Listen(ctx, "tcp", o.httpAddr)
	if err != nil {
		gl.Close()
		return fmt.Errorf("--http.addr: %w", err)
	}
	var dl net.Listener
	if s.debug != nil {
		if dl, err = lc.Listen(ctx, "tcp", o.debugAddr); err != nil {
			gl.Close()
			hl.Close()
			return fmt.Errorf("--debug.addr: %w", err)
		}
	}
	addrs := boundAddrs{GRPC: listen.Target(gl.Addr()), HTTP: hl.Addr().String()}
	if dl != nil {
		addrs.Debug = dl.Addr().String()
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 4)
	var wg sync.WaitGroup
	goRun := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				errc <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	// Logged before the servers start, so that it is in the log once
	// /readyz answers (the listeners already queue connections).
	s.log.Info("envoy-rls serving", "grpc", addrs.GRPC, "http", addrs.HTTP, "debug", addrs.Debug, "store", s.store.name,
		"vtprotobuf", rls.VTProto())
	goRun("grpc server", func() error { return ignoreStopped(s.grpc.Serve(gl)) })
	goRun("http server", func() error { return ignoreClosed(s.http.Serve(hl)) })
	if dl != nil {
		goRun("debug server", func() error { return ignoreClosed(s.debug.Serve(dl)) })
	}
	goRun("config watcher", func() error { return ignoreCanceled(s.watcher.Run(runCtx)) })
	wg.Add(1)
	go func() {
		defer wg.Done()
		var tlsTick, flushTick <-chan time.Time // nil, never ready, without TLS files or a log interval
		if len(s.tlsChecks) > 0 {
			t := time.NewTicker(o.tlsCheckInterval)
			defer t.Stop()
			tlsTick = t.C
		}
		if o.logRepeat > 0 {
			t := time.NewTicker(o.logRepeat)
			defer t.Stop()
			flushTick = t.C
		}
		for {
			select {
			case <-runCtx.Done():
				return
			case <-flushTick:
				s.lines.Flush(runCtx)
			case <-tlsTick:
				s.checkTLS()
			case <-hup:
				s.log.Info("SIGHUP: reloading config")
				s.watcher.Reload()
				s.checkTLS()
			}
		}
	}()

	if ready != nil {
		ready(addrs)
	}
	<-runCtx.Done()
	s.shutdown(o.drainTimeout)
	wg.Wait()
	close(errc)
	return <-errc // nil when every part stopped cleanly
}

// shutdown stops accepting, drains in-flight requests for at most drain,
// then closes everything.
func (s *server) shutdown(drain time.Duration) {
	s.log.Info("stopping: draining in-flight requests", "timeout", drain)
	s.health.Shutdown() // NOT_SERVING: Envoy's health checks move traffic away; Watch streams end
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.log.Warn("drain timeout: closing remaining gRPC streams")
		s.grpc.Stop()
		<-done
	}
	_ = s.http.Shutdown(ctx)
	if s.debug != nil {
		_ = s.debug.Shutdown(ctx)
	}
}

func (s *server) httpMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if s.watcher.Current() == nil {
			http.Error(w, "no config loaded", http.StatusServiceUnavailable)
			return
		}
		if err := s.store.ready(ctx); err != nil {
			http.Error(w, "store not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

func (s *server) debugMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /debug/config", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		writeConfig(w, s.watcher.Current())
	})
	s.dbg.register(mux) // /debug/explain, /debug/top
	return mux
}

// httpIdleTimeout closes a keep-alive connection of the metrics or debug
// listener after this long without a request: net/http waits for the next
// request without a deadline otherwise (ReadHeaderTimeout does not bound
// that wait), and each idle connection keeps a goroutine and a file.
const httpIdleTimeout = 2 * time.Minute

// newHTTPServer returns the server of the metrics or debug listener: a
// request's headers must arrive within 5 s, an idle connection is closed
// after httpIdleTimeout. No write timeout: /debug/pprof/profile writes for
// as long as it was asked to profile.
func newHTTPServer(h http.Handler, errorLog *stdlog.Logger) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: httpIdleTimeout, ErrorLog: errorLog}
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// ignoreStopped: a stop that came before Serve began (a SIGTERM during the
// start) makes Serve return grpc.ErrServerStopped, having closed its
// listener; that stop is as clean as any other.
func ignoreStopped(err error) error {
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
