package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// Options describe one run. The zero value of a field means its documented
// default.
type Options struct {
	// Addr is the target server, host:port or unix:/path. Required.
	Addr string
	// TLS, when set, is the client's TLS configuration: every connection
	// speaks TLS with it (gRPC's credentials.NewTLS, which verifies the
	// name of Addr's host unless TLS.ServerName is set). nil: plain text.
	TLS *tls.Config
	// Label names the run in reports. Default: the target address.
	Label string
	// Connections is the number of gRPC client connections (each one TCP
	// connection); calls are spread over them round-robin. Default 4.
	Connections int
	// Concurrency is the number of callers. In closed-loop mode each caller
	// sends its next request as soon as the previous answer arrives; in
	// open-loop mode it bounds the requests in flight. Default 16.
	Concurrency int
	// Duration is the length of the measured phase when Requests is 0.
	// Default 10s.
	Duration time.Duration
	// Requests, when positive, is the number of measured requests; the run
	// then lasts as long as they take and Duration is ignored.
	Requests int64
	// Warmup is a phase run before the measured one with the same load, whose
	// results are discarded. 0 means none (the command line defaults to 2s).
	Warmup time.Duration
	// Rate, when positive, selects open-loop mode: request k of a phase is
	// due at t0 + k/Rate and its latency is measured from that intended
	// time. A request that no caller was free to send in time is sent late,
	// with its whole Timeout from the actual send, and its lateness counts
	// in its latency. At most MaxRate.
	Rate float64
	// Domain is the rate-limit domain of every request. Default "edge".
	Domain string
	// Descriptors are the request's descriptors, one per template. At least
	// one is required.
	Descriptors []Template
	// Cardinality is the number of distinct indexes: each request draws an
	// index uniformly from [0, Cardinality) and expands every template with
	// it. Default 1 (index 0 only: one key).
	Cardinality int64
	// Hits, when positive, is sent as the request's hits_addend; 0 leaves it
	// unset (the server counts 1).
	Hits uint32
	// Timeout is each request's deadline. Default 1s.
	Timeout time.Duration
	// ConnectTimeout bounds the wait for every connection to be ready before
	// the run starts. Default 5s.
	ConnectTimeout time.Duration
	// ConnWindow, when positive, is every connection's fixed HTTP/2
	// flow-control window in bytes (65535 or more; streams keep HTTP/2's
	// initial 64 KiB), as Envoy's codec keeps fixed windows. 0 leaves
	// grpc-go's dynamic windows, for which the client sends a BDP PING on
	// most responses that the server must answer: a cost Envoy does not
	// impose on it. The command line defaults to 1 MiB.
	ConnWindow int
	// CPU lists processes whose CPU time (user + system) and run-queue wait
	// are read before and after the measured phase, to report them per
	// request.
	CPU []CPUProbe
	// Server, when set, is the target's latency histogram, scraped before
	// and after the measured phase (Result.Server); each scrape is bounded
	// by ConnectTimeout.
	Server *ServerHistogram
	// Redis lists URLs (redis://, rediss://, unix://) of the Redis servers
	// the target uses, whose INFO stats are read before and after the
	// measured phase (Result.Redis); each read is bounded by
	// ConnectTimeout. A Cluster's masters add up.
	Redis []string
	// Seed makes the index sequence reproducible; 0 picks a random seed.
	Seed uint64
	// FullDecode decodes every response whole, as a generated client does.
	// By default only its overall_code is read (see overallCode): the rest
	// is checked to be well-formed and skipped.
	FullDecode bool
	// Now is the clock (monotonic readings are used for intervals).
	// Default time.Now.
	Now func() time.Time
}

func (o Options) withDefaults() (Options, error) {
	if o.Addr == "" {
		return o, errors.New("no target address")
	}
	if o.Label == "" {
		o.Label = o.Addr
	}
	if o.Connections <= 0 {
		o.Connections = 4
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 16
	}
	if o.Duration <= 0 {
		o.Duration = 10 * time.Second
	}
	if o.Domain == "" {
		o.Domain = "edge"
	}
	if len(o.Descriptors) == 0 {
		return o, errors.New("no descriptor template")
	}
	if o.Cardinality <= 0 {
		o.Cardinality = 1
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 5 * time.Second
	}
	if o.Rate < 0 || o.Warmup < 0 || o.Requests < 0 {
		return o, errors.New("negative rate, warmup or request count")
	}
	if !(o.Rate <= MaxRate) { // NaN and +Inf too
		return o, fmt.Errorf("--rate %v: at most %d requests/s (0: closed loop)", o.Rate, int(MaxRate))
	}
	if o.ConnWindow != 0 && (o.ConnWindow < 65535 || o.ConnWindow > math.MaxInt32) {
		// grpc-go would ignore a smaller window without a word.
		return o, fmt.Errorf("--conn-window %d: must be 0 or from 65535 to %d bytes", o.ConnWindow, math.MaxInt32)
	}
	if o.Seed == 0 {
		o.Seed = rand.Uint64()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o, nil
}

// MaxRate is the highest open-loop rate, 10 million requests/s: beyond, the
// schedule's interval nears a nanosecond and a run would not end.
const MaxRate = 1e7

// Mode returns "open" for an open-loop (fixed-rate) run and "closed" otherwise.
func (o Options) Mode() string {
	if o.Rate > 0 {
		return "open"
	}
	return "closed"
}

// Run executes one run against o.Addr: it connects, runs the warm-up phase
// (discarded) and the measured phase, and returns the measured Result. It
// returns an error only when the run could not be carried out (bad options,
// target unreachable, ctx cancelled); failed calls are counted in the Result.
// Run owns every goroutine it starts and returns after all have stopped.
func Run(ctx context.Context, o Options) (*Result, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	cs, closeAll, err := dial(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("bench %s: %w", o.Label, err)
	}
	defer closeAll()
	var rp *redisProbes
	if len(o.Redis) > 0 {
		if rp, err = openRedisProbes(ctx, o.Redis, o.ConnectTimeout); err != nil {
			return nil, fmt.Errorf("bench %s: %w", o.Label, err)
		}
		defer rp.close()
	}

	if o.Warmup > 0 {
		wo := o
		wo.Requests, wo.Duration = 0, o.Warmup
		if _, err := phase(ctx, wo, cs, 1); err != nil {
			return nil, fmt.Errorf("bench %s: warm-up: %w", o.Label, err)
		}
	}
	hc := &http.Client{Timeout: o.ConnectTimeout}
	scrape := func() ([]bucket, error) {
		if o.Server == nil {
			return nil, nil
		}
		return scrapeHistogram(ctx, hc, *o.Server)
	}
	hBefore, err := scrape()
	if err != nil {
		return nil, fmt.Errorf("bench %s: %w", o.Label, err)
	}
	var rBefore, rAfter []redisStats
	if rp != nil {
		if rBefore, err = rp.read(ctx); err != nil {
			return nil, fmt.Errorf("bench %s: %w", o.Label, err)
		}
	}
	mBefore, haveMachine, err := readCPUTicks(procStatPath)
	if err != nil {
		return nil, fmt.Errorf("bench %s: %w", o.Label, err)
	}
	before, err := readProbes(o.CPU)
	if err != nil {
		return nil, fmt.Errorf("bench %s: %w", o.Label, err)
	}
	m, err := phase(ctx, o, cs, 2)
	if err != nil {
		return nil, fmt.Errorf("bench %s: %w", o.Label, err)
	}
	after, err := readProbes(o.CPU)
	if err != nil {
		return nil, fmt.Errorf("bench %s: %w", o.Label, err)
	}
	mAfter, _, err := readCPUTicks(procStatPath)
	if err != nil {
		return nil, fmt.Errorf("bench %s: %w", o.Label, err)
	}
	if rp != nil {
		if rAfter, err = rp.read(ctx); err != nil {
			return nil, fmt.Errorf("bench %s: %w", o.Label, err)
		}
	}
	hAfter, err := scrape()
	if err != nil {
		return nil, fmt.Errorf("bench %s: %w", o.Label, err)
	}
	r := newResult(o, m, before, after)
	if haveMachine {
		r.Machine = machineBetween(mBefore, mAfter)
	}
	if rp != nil {
		r.Redis = redisUseBetween(rBefore, rAfter, r.OK+r.OverLimit)
	}
	if o.Server != nil {
		if r.Server, err = serverLatency(hBefore, hAfter); err != nil {
			return nil, fmt.Errorf("bench %s: %w", o.Label, err)
		}
	}
	return r, nil
}

// conns are a run's connections to the target, and how responses are
// decoded.
type conns struct {
	cc     []*grpc.ClientConn
	decode []grpc.CallOption // with the code-only codec unless FullDecode
}

// dial opens o.Connections client connections and waits until each is
// ready, so connection set-up is not part of the measurement.
func dial(ctx context.Context, o Options) (*conns, func(), error) {
	cs := &conns{}
	closeAll := func() {
		for _, c := range cs.cc {
			c.Close()
		}
	}
	if !o.FullDecode {
		codec, err := newCodeCodec()
		if err != nil {
			return nil, nil, err
		}
		cs.decode = []grpc.CallOption{grpc.ForceCodecV2(codec)}
	}
	cctx, cancel := context.WithTimeout(ctx, o.ConnectTimeout)
	defer cancel()
	creds := insecure.NewCredentials()
	if o.TLS != nil {
		creds = credentials.NewTLS(o.TLS)
	}
	dialOpts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if o.ConnWindow > 0 {
		dialOpts = append(dialOpts, grpc.WithStaticConnWindowSize(int32(o.ConnWindow)))
	}
	for range o.Connections {
		cc, err := grpc.NewClient(o.Addr, dialOpts...)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("connect to %s: %w", o.Addr, err)
		}
		cs.cc = append(cs.cc, cc)
		cc.Connect()
	}
	for _, cc := range cs.cc {
		for st := cc.GetState(); st != connectivity.Ready; st = cc.GetState() {
			if !cc.WaitForStateChange(cctx, st) {
				why := connectError(ctx, cc, st, o.Timeout)
				closeAll()
				return nil, nil, fmt.Errorf("connect to %s: not ready within %v (last state %v%s)", o.Addr, o.ConnectTimeout, st, why)
			}
		}
	}
	return cs, closeAll, nil
}

// connectError returns ": " and why cc, found in state st, could not
// connect (a refused connection, a certificate that does not verify...), or
// "" when that is not known. gRPC does not expose the reason, but in
// TRANSIENT_FAILURE a call that does not wait for the connection fails at
// once with it: one health check tells it (it is sent only if the
// connection has just become ready); timeout bounds it.
func connectError(ctx context.Context, cc *grpc.ClientConn, st connectivity.State, timeout time.Duration) string {
	if st != connectivity.TransientFailure {
		return ""
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{})
	if s, ok := status.FromError(err); ok && s.Code() == codes.Unavailable {
		return ": " + s.Message()
	}
	return ""
}

// measurement is what one phase observed, merged over all callers.
type measurement struct {
	tally
	scheduled int64         // open loop: requests scheduled
	elapsed   time.Duration // from phase start to the last answer
	maxLag    time.Duration // open loop: largest delay between intended and actual send
}

// tally is what one caller observed; callers own theirs and they are merged
// at the end.
type tally struct {
	hist      Histogram
	ok        int64
	overLimit int64
	errs      map[string]int64
	lag       time.Duration
}

func (t *tally) merge(o *tally) {
	t.hist.Merge(&o.hist)
	t.ok += o.ok
	t.overLimit += o.overLimit
	t.errs = addCounts(t.errs, o.errs)
	t.lag = max(t.lag, o.lag)
}

// caller holds one caller goroutine's state: its request message (reused,
// since a call has finished marshalling it when it returns), its index
// source and its tally.
type caller struct {
	o      *Options
	conns  *conns
	next   int // round-robin position over conns.cc
	rng    *rand.Rand
	req    *rlsv3.RateLimitRequest
	varies bool
	buf    []byte
	resp   overallCode // the answer, unless FullDecode
	tally
}

func newCaller(o *Options, cs *conns, id int, stream uint64) *caller {
	c := &caller{
		o:     o,
		conns: cs,
		next:  id % len(cs.cc),
		rng:   rand.New(rand.NewPCG(o.Seed, stream<<32|uint64(id))),
		req:   &rlsv3.RateLimitRequest{Domain: o.Domain, HitsAddend: o.Hits},
	}
	for _, t := range o.Descriptors {
		d := &ratelimitv3.RateLimitDescriptor{}
		for j := range t.Len() {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: t.Key(j)})
		}
		c.req.Descriptors = append(c.req.Descriptors, d)
		c.varies = c.varies || t.Varies()
	}
	c.fill(0)
	return c
}

// fill sets the descriptor values for index i.
func (c *caller) fill(i int64) {
	for k, t := range c.o.Descriptors {
		for j, e := range c.req.Descriptors[k].Entries {
			c.buf = t.AppendValue(c.buf[:0], j, i)
			if e.Value != string(c.buf) {
				e.Value = string(c.buf)
			}
		}
	}
}

// call sends one request whose latency counts from start (the intended
// send time in open loop) and whose deadline is Timeout from the actual
// send, and records the outcome. A late send gets the whole Timeout: a
// deadline from the intended time made a generator that fell behind its
// schedule give up on requests the server was answering, and report a
// fraction of the server's rate.
func (c *caller) call(ctx context.Context, start time.Time) {
	if c.varies && c.o.Cardinality > 1 {
		c.fill(c.rng.Int64N(c.o.Cardinality))
	}
	cc := c.conns.cc[c.next]
	c.next = (c.next + 1) % len(c.conns.cc)
	cctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	var (
		code rlsv3.RateLimitResponse_Code
		err  error
	)
	if c.o.FullDecode {
		resp := new(rlsv3.RateLimitResponse)
		err = cc.Invoke(cctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, c.req, resp)
		code = resp.GetOverallCode()
	} else {
		err = cc.Invoke(cctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, c.req, &c.resp, c.conns.decode...)
		code = c.resp.code
	}
	cancel()
	c.hist.RecordDuration(c.o.Now().Sub(start))
	switch {
	case err != nil:
		c.countErr(status.Code(err).String())
	case code == rlsv3.RateLimitResponse_OK:
		c.ok++
	case code == rlsv3.RateLimitResponse_OVER_LIMIT:
		c.overLimit++
	default:
		c.countErr("overall_code=" + code.String())
	}
}

func (c *caller) countErr(kind string) {
	if c.errs == nil {
		c.errs = map[string]int64{}
	}
	c.errs[kind]++
}

// phase runs one phase with o's load and returns what it measured. stream
// separates the index sequences of the phases.
func phase(ctx context.Context, o Options, cs *conns, stream uint64) (measurement, error) {
	callers := make([]*caller, o.Concurrency)
	for id := range callers {
		callers[id] = newCaller(&o, cs, id, stream)
	}
	var (
		m     measurement
		start time.Time
	)
	if o.Rate > 0 {
		var err error
		if m.scheduled, start, err = openLoop(ctx, &o, callers); err != nil {
			return m, fmt.Errorf("open loop: %w", err)
		}
	} else {
		start = closedLoop(ctx, &o, callers)
	}
	m.elapsed = o.Now().Sub(start)
	if o.Rate > 0 {
		// k requests scheduled 1/Rate apart occupy k intervals, the last
		// one included: ending at the last answer would report a short run
		// faster than its rate (3 requests at 1/s: 1.5/s).
		m.elapsed = max(m.elapsed, time.Duration(float64(m.scheduled)/o.Rate*float64(time.Second)))
	}
	for _, c := range callers {
		m.merge(&c.tally)
	}
	m.maxLag = m.lag
	if err := ctx.Err(); err != nil {
		return m, err
	}
	return m, nil
}

// closedLoop runs the callers back to back until the request budget or the
// duration is used up, and returns the phase's start time.
func closedLoop(ctx context.Context, o *Options, callers []*caller) time.Time {
	var (
		wg     sync.WaitGroup
		budget atomic.Int64
	)
	budget.Store(o.Requests)
	start := o.Now()
	end := start.Add(o.Duration)
	for _, c := range callers {
		wg.Go(func() {
			for ctx.Err() == nil {
				if o.Requests > 0 {
					if budget.Add(-1) < 0 {
						return
					}
				}
				t := o.Now()
				if o.Requests == 0 && !t.Before(end) {
					return
				}
				c.call(ctx, t)
			}
		})
	}
	wg.Wait()
	return start
}

// openLoop schedules requests at start + k/Rate and hands each intended time
// to the first free caller. It returns the number of requests scheduled and
// the phase's start time.
func openLoop(ctx context.Context, o *Options, callers []*caller) (int64, time.Time, error) {
	due := make(chan time.Time, len(callers))
	var wg sync.WaitGroup
	for _, c := range callers {
		wg.Go(func() {
			for intended := range due {
				if lag := o.Now().Sub(intended); lag > c.lag {
					c.lag = lag
				}
				c.call(ctx, intended)
			}
		})
	}
	k, start, err := schedule(ctx, o, due)
	close(due)
	wg.Wait()
	return k, start, err
}

// schedule sends the intended times of an open-loop phase on due until the
// request budget or the duration is used up or ctx ends.
func schedule(ctx context.Context, o *Options, due chan<- time.Time) (int64, time.Time, error) {
	start := o.Now()
	interval := float64(time.Second) / o.Rate
	var k int64
	for ; ctx.Err() == nil; k++ {
		if o.Requests > 0 && k >= o.Requests {
			break
		}
		intended := start.Add(time.Duration(float64(k) * interval))
		if o.Requests == 0 && intended.Sub(start) >= o.Duration {
			break
		}
		if err := sleepUntil(ctx, o.Now, intended); err != nil {
			if ctx.Err() != nil {
				break // the phase reports ctx.Err()
			}
			return k, start, err
		}
		select {
		case due <- intended:
			// Let the caller that took it send now, on this thread,
			// rather than wake another thread for it while this one
			// goes back to sleep in the kernel.
			runtime.Gosched()
		case <-ctx.Done():
			return k, start, nil
		}
	}
	return k, start, nil
}
