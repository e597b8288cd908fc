// Command rls-bench is a load generator for any Envoy RateLimitService v3
// gRPC server (envoy-rls, envoyproxy/ratelimit, ...). It reports throughput,
// latency percentiles, the answers (OK, OVER_LIMIT, errors), optionally the
// CPU time per request of named processes, and the throughput as a fraction
// of a do-nothing server's (the "ceiling").
//
// Usage:
//
//	rls-bench [flags]                  run load against --addr (see -h)
//	rls-bench serve-noop [--addr :8089] run a do-nothing RLS server
//	rls-bench report [file ...]        combine JSON results into one table
//
// report --compare PREFIX [--to PREFIX] sets two servers (or two settings of
// one) against each other: the runs of each load labelled with one prefix
// against those labelled with the other, paired in the order they were run,
// and prints each figure's median ratio over the pairs and in how many pairs
// the --to side did better. make bench runs the sides back to back in every
// round, alternating which goes first, so a pair saw the same machine.
//
// Closed loop (default): --concurrency callers each send a request as soon as
// the previous one is answered. Open loop (--rate R): request k is due at
// t0 + k/R and its latency counts from that intended time (its deadline from
// its actual send), so
// a server that stalls is charged for every request that should have been
// sent meanwhile (no coordinated omission); --concurrency then bounds the
// requests in flight, and requests a saturated generator sends late still
// count their lateness.
//
// --server-metrics URL scrapes the target's latency histogram
// (--server-histogram, by default envoy-rls's
// envoy_rls_request_duration_seconds) before and after the measured phase and
// reports the server's own p50 and p99 beside the generator's: the
// difference is the transport's, the kernel's and the generator's.
//
// The ceiling: --self-test (alias --ceiling) starts a do-nothing server in
// this process on 127.0.0.1:0 and runs the identical load against it first;
// --ceiling-addr uses a do-nothing server already running elsewhere, e.g.
// `rls-bench serve-noop` in its own process. In process is convenient (no
// second process to manage) but the server shares this process's CPU and Go
// scheduler with the generator: on a busy machine the kernel's fair share
// goes to one process instead of two, and the generator's own CPU (--cpu
// x=self) then includes the server's. On a shared 2-core machine the
// in-process ceiling came out at about a third of the separate process's
// (1.9k vs 5.3k requests/s at 16 callers). A separate process is the fairer
// comparison, because the real target runs as a separate process too;
// scripts/bench.sh uses serve-noop.
//
// TLS: --tls (the system's authorities) or any of --tls.ca, --tls.cert,
// --tls.key, --tls.server-name, --tls.insecure-skip-verify makes every
// connection to --addr, and to --ceiling-addr, speak TLS; `serve-noop
// --tls.cert F --tls.key F` (and --tls.client-ca F for mutual TLS) is the
// do-nothing server to compare a TLS target with. The in-process server of
// --self-test speaks plain text only, so --self-test with TLS is refused.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/envoy-rls/envoy-rls/cmd/rls-bench/internal/bench"
	"github.com/envoy-rls/envoy-rls/internal/gcpercent"
	"github.com/envoy-rls/envoy-rls/internal/tlsfiles"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command with its environment passed in; it returns the
// exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "serve-noop":
			return serveNoop(ctx, args[1:], stderr)
		case "report":
			return report(args[1:], os.Stdin, stdout, stderr)
		}
	}
	cfg, err := parseLoad(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "rls-bench: %v\n", err)
		return 2
	}
	setGC(cfg.gc, stderr)
	results, err := load(ctx, cfg, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "rls-bench: %v\n", err)
		return 1
	}
	if cfg.json {
		err = bench.WriteJSON(stdout, results)
	} else {
		err = bench.WriteTable(stdout, results, bench.Aligned)
	}
	if err != nil {
		fmt.Fprintf(stderr, "rls-bench: %v\n", err)
		return 1
	}
	return 0
}

// loadConfig is the parsed command line of a load run.
type loadConfig struct {
	opts        bench.Options
	json        bool
	selfTest    bool   // ceiling from an in-process do-nothing server
	ceilingAddr string // ceiling from a do-nothing server at this address
	isCeiling   bool   // mark the run itself as a ceiling run
	gc          *gcpercent.Flag
}

// gcUsage is --gc-percent's: this process's GOGC (internal/gcpercent), that
// of the generator and of an in-process do-nothing server alike, and of
// serve-noop's. Its default is envoy-rls's, for two reasons: a do-nothing
// server collecting more often than envoy-rls would lower the ceiling that
// envoy-rls is measured against, and the generator's own collections delay
// the answers it is timing (docs/performance.md, "The measurement's own
// collector").
const gcUsage = "this process's GOGC, the Go garbage collector's heap growth in `percent` (1 or more): envoy-rls's default, for the generator and the do-nothing server alike; when the GOGC variable is set and this flag is not given, GOGC applies"

// setGC applies g to this process and says so on stderr.
func setGC(g *gcpercent.Flag, stderr io.Writer) {
	gogc, from := g.Apply(os.LookupEnv, debug.SetGCPercent)
	fmt.Fprintf(stderr, "rls-bench: GOGC %s (from %s)\n", gogc, from)
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

func parseLoad(args []string, stderr io.Writer) (loadConfig, error) {
	var (
		cfg         loadConfig
		descriptors multiFlag
		cpus        multiFlag
		redisURLs   multiFlag
		hits        uint
		srvMetrics  string
		srvHist     string
		tlsFlags    tlsfiles.ClientFlags
		o           = &cfg.opts
	)
	fs := flag.NewFlagSet("rls-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Addr, "addr", "", "target RateLimitService gRPC address: host:port, or unix:/path/to/socket")
	fs.StringVar(&o.Label, "label", "", "name of the run in the report (default: the target address)")
	fs.IntVar(&o.Connections, "connections", 4, "gRPC client connections, used round-robin")
	fs.IntVar(&o.Concurrency, "concurrency", 16, "callers (closed loop), or the bound on requests in flight (open loop)")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "length of the measured phase (unless --requests is set)")
	fs.Int64Var(&o.Requests, "requests", 0, "number of measured requests (instead of --duration)")
	fs.DurationVar(&o.Warmup, "warmup", 2*time.Second, "warm-up with the same load before measuring; results discarded")
	fs.Float64Var(&o.Rate, "rate", 0, "open loop: requests per second on a fixed schedule, latency from the intended send time (0: closed loop)")
	fs.StringVar(&o.Domain, "domain", "edge", "rate-limit domain")
	fs.Var(&descriptors, "descriptor", "descriptor template key=value[,key=value...]; {i} is the request's random index in [0, --cardinality), {i%N} that index modulo N; repeat for several descriptors per request (default remote_address=10.0.{i})")
	fs.Int64Var(&o.Cardinality, "cardinality", 1, "number of distinct indexes {i} (1: a single key)")
	fs.UintVar(&hits, "hits", 0, "hits_addend of each request (0: unset, the server counts 1)")
	fs.DurationVar(&o.Timeout, "timeout", time.Second, "per-request deadline")
	fs.DurationVar(&o.ConnectTimeout, "connect-timeout", 5*time.Second, "how long to wait for the connections to be ready")
	fs.IntVar(&o.ConnWindow, "conn-window", 1<<20, "fixed HTTP/2 flow-control window of each connection, in bytes (65535 or more), as Envoy keeps; 0: grpc-go's dynamic windows, whose BDP PINGs (one on most responses) the server must answer")
	fs.BoolVar(&cfg.json, "json", false, "print one JSON object per run instead of the table")
	fs.BoolVar(&cfg.selfTest, "self-test", false, "first run the same load against a do-nothing server in this process and report the target as a fraction of it")
	fs.BoolVar(&cfg.selfTest, "ceiling", false, "alias of --self-test")
	fs.StringVar(&cfg.ceilingAddr, "ceiling-addr", "", "like --self-test, but against a do-nothing server at this address (rls-bench serve-noop), dialled with the same --tls.* settings as --addr")
	fs.BoolVar(&cfg.isCeiling, "is-ceiling", false, "mark this run as a ceiling run (the target is a do-nothing server), for the report subcommand")
	fs.Var(&cpus, "cpu", "name=pid (or name=self): report that process's CPU µs per request over the measured phase, and its threads' run-queue wait (runnable, waiting for a CPU) per request where Linux keeps scheduler statistics; repeatable, and probes of the same name add up (e.g. a Redis Cluster's masters)")
	fs.Var(&redisURLs, "redis-stats", "URL of a Redis the target uses (redis://host:port, rediss://... verified against the system's authorities, unix:///path): report the commands it processed and its read events (about one per round trip) per request over the measured phase, from INFO stats; repeatable, and the servers add up (a Redis Cluster's masters)")
	fs.StringVar(&srvMetrics, "server-metrics", "", "URL of the target's Prometheus metrics (e.g. http://127.0.0.1:8080/metrics): report the target's own p50/p99 over the measured phase from --server-histogram")
	fs.StringVar(&srvHist, "server-histogram", "envoy_rls_request_duration_seconds", "with --server-metrics: the target's latency histogram (in seconds; its series are added together)")
	fs.Uint64Var(&o.Seed, "seed", 0, "seed of the random indexes (0: random)")
	cfg.gc = gcpercent.New(fs, "gc-percent", gcUsage)
	fs.BoolVar(&o.FullDecode, "full-decode", false, "decode every response whole, as a generated client does (default: read only its overall_code, so that the generator's CPU does not grow with what the server answers)")
	tlsFlags.Register(fs, "server")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage:\n  rls-bench --addr host:port [--tls --tls.ca F ...] [flags]\n  rls-bench serve-noop [--addr :8089] [--gc-percent 400] [--tls.cert F --tls.key F [--tls.client-ca F [--tls.client-san N]]]\n  rls-bench report [--median] [--json | [--markdown] [--compare PREFIX [--to PREFIX] [--max-steal PCT]]] [results.jsonl ...]\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q (see -h)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := cfg.gc.Check(); err != nil {
		return cfg, err
	}
	if set["duration"] && set["requests"] {
		return cfg, errors.New("set --duration or --requests, not both")
	}
	if o.Duration <= 0 {
		// Run would take its default, 10 s, for it.
		return cfg, fmt.Errorf("--duration %v: must be positive", o.Duration)
	}
	if o.Requests < 0 || o.Rate < 0 || o.Cardinality < 1 || o.Connections < 1 || o.Concurrency < 1 || o.Warmup < 0 {
		return cfg, errors.New("--requests, --rate and --warmup must not be negative; --cardinality, --connections and --concurrency must be at least 1")
	}
	if !(o.Rate <= bench.MaxRate) { // NaN and +Inf too
		return cfg, fmt.Errorf("--rate %v: at most %d requests/s (0: closed loop)", o.Rate, int(bench.MaxRate))
	}
	if hits > 1<<32-1 {
		return cfg, fmt.Errorf("--hits %d does not fit hits_addend (uint32)", hits)
	}
	o.Hits = uint32(hits)
	if o.Addr == "" && !cfg.selfTest {
		return cfg, errors.New("no target: set --addr, or --self-test to measure the do-nothing server alone")
	}
	tlsCfg, err := tlsFlags.Config()
	if err != nil {
		return cfg, err
	}
	if tlsCfg != nil && cfg.selfTest && cfg.ceilingAddr == "" {
		return cfg, errors.New("--self-test's do-nothing server runs in this process in plain text, but --tls/--tls.* ask for TLS: " +
			"start `rls-bench serve-noop --tls.cert F --tls.key F` and pass its address with --ceiling-addr instead " +
			"(it is dialled with the same --tls.* settings)")
	}
	o.TLS = tlsCfg
	if len(descriptors) == 0 {
		descriptors = multiFlag{"remote_address=10.0.{i}"}
	}
	for _, d := range descriptors {
		t, err := bench.ParseTemplate(d)
		if err != nil {
			return cfg, fmt.Errorf("--descriptor: %w", err)
		}
		o.Descriptors = append(o.Descriptors, t)
	}
	if srvMetrics != "" {
		u, err := url.Parse(srvMetrics)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return cfg, fmt.Errorf("--server-metrics %q: want an http:// or https:// URL", srvMetrics)
		}
		if srvHist == "" {
			return cfg, errors.New("--server-histogram must name a histogram")
		}
		o.Server = &bench.ServerHistogram{URL: srvMetrics, Metric: srvHist}
	} else if set["server-histogram"] {
		return cfg, errors.New("--server-histogram needs --server-metrics")
	}
	for _, u := range redisURLs {
		if err := bench.ParseRedisURL(u); err != nil {
			return cfg, fmt.Errorf("--redis-stats: %w", err)
		}
		o.Redis = append(o.Redis, u)
	}
	for _, c := range cpus {
		p, err := bench.ParseCPUProbe(c)
		if err != nil {
			return cfg, fmt.Errorf("--cpu: %w", err)
		}
		o.CPU = append(o.CPU, p)
	}
	return cfg, nil
}

// load runs the ceiling (when asked) and the target, and returns their
// results in that order.
func load(ctx context.Context, cfg loadConfig, stderr io.Writer) ([]*bench.Result, error) {
	var results []*bench.Result
	var ceiling *bench.Result
	if cfg.selfTest || cfg.ceilingAddr != "" {
		co := cfg.opts
		// The probed processes other than this one are idle during the
		// ceiling run: keep only the probes of this process. The
		// do-nothing server has no metrics, and uses no Redis.
		co.CPU, co.Server, co.Redis = nil, nil, nil
		for _, p := range cfg.opts.CPU {
			if p.PID == 0 {
				co.CPU = append(co.CPU, p)
			}
		}
		co.Label = "ceiling"
		if cfg.opts.Label != "" {
			co.Label = cfg.opts.Label + " ceiling"
		}
		if cfg.ceilingAddr != "" {
			co.Addr = cfg.ceilingAddr
		} else {
			srv, err := bench.StartNoop("127.0.0.1:0")
			if err != nil {
				return nil, err
			}
			defer srv.Close()
			co.Addr = srv.Addr()
			co.Label += " (in-process)"
		}
		fmt.Fprintf(stderr, "rls-bench: ceiling run against do-nothing server %s\n", co.Addr)
		r, err := bench.Run(ctx, co)
		if err != nil {
			return nil, fmt.Errorf("ceiling: %w", err)
		}
		r.Ceiling = true
		ceiling = r
		warnSteal(stderr, r)
		results = append(results, r)
	}
	if cfg.opts.Addr != "" {
		fmt.Fprintf(stderr, "rls-bench: %s run against %s\n", cfg.opts.Mode(), cfg.opts.Addr)
		r, err := bench.Run(ctx, cfg.opts)
		if err != nil {
			return nil, err
		}
		r.Ceiling = cfg.isCeiling
		if ceiling != nil {
			r.SetCeiling(ceiling.RPS)
		}
		warnSteal(stderr, r)
		results = append(results, r)
	}
	return results, nil
}

// warnSteal says on stderr when the hypervisor took much of the machine
// during r (Result.StealWarning).
func warnSteal(stderr io.Writer, r *bench.Result) {
	if w := r.StealWarning(); w != "" {
		fmt.Fprintf(stderr, "rls-bench: warning: %s\n", w)
	}
}

// serveNoop runs a do-nothing RLS server until ctx ends.
func serveNoop(ctx context.Context, args []string, stderr io.Writer) int {
	// The server's handshakes report reloaded TLS files from their own
	// goroutines.
	stderr = &lockedWriter{w: stderr}
	fs := flag.NewFlagSet("rls-bench serve-noop", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", ":8089", "listen address: host:port, or unix:/path/to/socket")
	gc := gcpercent.New(fs, "gc-percent", gcUsage)
	var tlsFiles tlsfiles.ServerFiles
	tlsFiles.Register(fs, "tls.")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := gc.Check(); err != nil {
		fmt.Fprintf(stderr, "rls-bench serve-noop: %v\n", err)
		return 2
	}
	noopOpts, mode, err := noopTLS(tlsFiles, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "rls-bench serve-noop: %v\n", err)
		return 2
	}
	setGC(gc, stderr)
	srv, err := bench.StartNoop(*addr, noopOpts...)
	if err != nil {
		fmt.Fprintf(stderr, "rls-bench serve-noop: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "rls-bench serve-noop: do-nothing RateLimitService listening on %s (%s)\n", srv.Addr(), mode)
	select {
	case <-ctx.Done():
	case <-srv.Done():
	}
	if err := srv.Close(); err != nil {
		fmt.Fprintf(stderr, "rls-bench serve-noop: %v\n", err)
		return 1
	}
	return 0
}

// noopTLSLine is what serve-noop writes about a load of its TLS files
// ("" for the first: the "listening on" line says TLS).
func noopTLSLine(l tlsfiles.Loaded) string {
	switch {
	case l.Initial:
		return ""
	case l.Restored:
		return fmt.Sprintf("the TLS files hold the ones in use again: %s", l.Subject)
	case l.Err != nil:
		return fmt.Sprintf("the changed TLS files did not load, %s is still served: %v", l.Subject, l.Err)
	}
	return fmt.Sprintf("TLS files reloaded: %s, valid until %s", l.Subject, l.NotAfter.UTC().Format(time.RFC3339))
}

// noopTLS checks serve-noop's --tls.* flags and loads their files; it
// returns the server's options and its mode ("plain text", "TLS", "mutual
// TLS") for the log. An error names the flags. Every later load of the
// files is reported on stderr.
func noopTLS(f tlsfiles.ServerFiles, stderr io.Writer) ([]bench.NoopOption, string, error) {
	if err := f.CheckFlags("tls."); err != nil {
		return nil, "", err
	}
	if f.Cert == "" {
		return nil, "plain text", nil
	}
	srv, err := tlsfiles.NewServer(f, func(l tlsfiles.Loaded) {
		if line := noopTLSLine(l); line != "" {
			fmt.Fprintln(stderr, "rls-bench serve-noop:", line)
		}
	})
	if err != nil {
		return nil, "", fmt.Errorf("--tls.*: %w", err)
	}
	mode := "TLS"
	if f.ClientCA != "" {
		mode = "mutual TLS"
	}
	return []bench.NoopOption{bench.NoopTLS(srv.Config())}, mode, nil
}

// lockedWriter serializes the writes of the goroutines that share w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// report reads JSON results (files, or stdin when none are named), matches
// each run with the ceiling run of the same mode, callers, rate,
// descriptors per request and TLS, and prints the table (or the completed
// JSON with --json).
func report(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rls-bench report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON (with the ceiling fields filled) instead of the table")
	markdown := fs.Bool("markdown", false, "print the table (and the comparison) as Markdown tables, with the same figures")
	medians := fs.Bool("median", false, "combine repeated runs of the same load (label, target, mode, callers, rate, descriptors per request) into one row of medians")
	var cmpOpts bench.CompareOptions
	fs.StringVar(&cmpOpts.Base, "compare", "", "after the table, compare the runs whose label is `PREFIX` and a load's label with those whose label is --to's prefix and the same load's, run against run in the order run: each figure's median ratio over the pairs and in how many pairs the --to side did better (\"\" is the runs without a prefix)")
	fs.StringVar(&cmpOpts.Other, "to", "", "with --compare: the `PREFIX` of the runs compared with --compare's (\"\", the default, is the runs without a prefix)")
	fs.Float64Var(&cmpOpts.MaxSteal, "max-steal", 0, "with --compare: leave out the pairs in which either run lost this `percent` or more of the machine's CPU time to the hypervisor (steal); 0 keeps every pair")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	compare := set["compare"]
	switch {
	case !compare && (set["to"] || set["max-steal"]):
		fmt.Fprintln(stderr, "rls-bench report: --to and --max-steal go with --compare")
		return 2
	case *asJSON && *markdown:
		fmt.Fprintln(stderr, "rls-bench report: --json or --markdown, not both")
		return 2
	case compare && *asJSON:
		fmt.Fprintln(stderr, "rls-bench report: --compare writes a table; it does not go with --json")
		return 2
	case cmpOpts.MaxSteal < 0 || cmpOpts.MaxSteal > 100:
		fmt.Fprintf(stderr, "rls-bench report: --max-steal %g: want a percentage from 0 to 100\n", cmpOpts.MaxSteal)
		return 2
	}
	var all []*bench.Result
	readFrom := func(name string, r io.Reader) error {
		rs, err := bench.ReadJSON(r)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		all = append(all, rs...)
		return nil
	}
	var err error
	if fs.NArg() == 0 {
		err = readFrom("stdin", stdin)
	}
	for _, name := range fs.Args() {
		f, ferr := os.Open(name)
		if ferr != nil {
			err = ferr
			break
		}
		err = readFrom(name, f)
		f.Close()
		if err != nil {
			break
		}
	}
	layout := bench.Aligned
	if *markdown {
		layout = bench.Markdown
	}
	var cmps []bench.Comparison
	if err == nil && compare {
		// Pairs of single runs, before Medians combines them.
		cmps, err = bench.Compare(all, cmpOpts)
		if err == nil && len(cmps) == 0 {
			err = fmt.Errorf("--compare %q --to %q: no load was measured on both sides", cmpOpts.Base, cmpOpts.Other)
		}
	}
	if err == nil {
		if *medians {
			all = bench.Medians(all)
		}
		bench.FillCeilings(all)
		if *asJSON {
			err = bench.WriteJSON(stdout, all)
		} else {
			err = bench.WriteTable(stdout, all, layout)
		}
	}
	if err == nil && compare {
		fmt.Fprintln(stdout)
		err = bench.WriteComparisons(stdout, cmps, cmpOpts, layout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "rls-bench report: %v\n", err)
		return 1
	}
	return 0
}
