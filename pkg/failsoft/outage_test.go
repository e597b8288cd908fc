package failsoft_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/failsoft"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/memorybackend"
	"github.com/envoy-rls/envoy-rls/pkg/redisbackend"
)

// envoyTimeout is Envoy's default rate-limit timeout: every Check in these
// tests runs under a context with this deadline, as the gRPC handler would.
const envoyTimeout = 20 * time.Millisecond

// poolSize is the redisbackend pool in the outage tests; there are more
// workers than connections.
const poolSize = 4

// workers and pace shape the load of the outage tests: each worker checks
// once per pace (about 1,200 checks a second in all). Unpaced loops would
// starve redis-server of CPU on a small machine under -race, and a healthy
// Redis would miss its 20 ms.
const (
	workers = 6
	pace    = 5 * time.Millisecond
)

// fault is one way for Redis to become unavailable, and its healing.
type fault struct {
	name     string
	viaProxy bool
	inject   func(t *testing.T, r *testenv.Redis, p *proxy)
	heal     func(t *testing.T, r *testenv.Redis, p *proxy)
}

func TestOutages(t *testing.T) {
	faults := []fault{
		{
			name:     "latency 200ms",
			viaProxy: true,
			inject: func(t *testing.T, _ *testenv.Redis, p *proxy) {
				p.add(t, "latency", "downstream", map[string]any{"latency": 200})
			},
			heal: func(t *testing.T, _ *testenv.Redis, p *proxy) { p.remove(t, "latency") },
		},
		{
			name: "SIGKILL and restart on the same port",
			inject: func(t *testing.T, r *testenv.Redis, _ *proxy) {
				r.Kill()
			},
			heal: func(t *testing.T, r *testenv.Redis, _ *proxy) { r.Start() },
		},
		{
			name:     "connection reset",
			viaProxy: true,
			inject: func(t *testing.T, _ *testenv.Redis, p *proxy) {
				p.add(t, "reset_peer", "upstream", map[string]any{"timeout": 0})
			},
			heal: func(t *testing.T, _ *testenv.Redis, p *proxy) { p.remove(t, "reset_peer") },
		},
		{
			name:     "black hole (timeout toxic)",
			viaProxy: true,
			inject: func(t *testing.T, _ *testenv.Redis, p *proxy) {
				p.add(t, "timeout", "upstream", map[string]any{"timeout": 0})
			},
			heal: func(t *testing.T, _ *testenv.Redis, p *proxy) { p.remove(t, "timeout") },
		},
		{
			name:   "black hole (SIGSTOP)",
			inject: func(t *testing.T, r *testenv.Redis, _ *proxy) { r.Pause() },
			heal:   func(t *testing.T, r *testenv.Redis, _ *proxy) { r.Resume() },
		},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) { runOutage(t, f) })
	}
}

// workload runs Checks from several goroutines, each under an Envoy-like
// deadline, and checks every answer against the request's failure mode.
type workload struct {
	fs      *failsoft.Limiter
	stop    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
	sources [4]atomic.Int64 // answers by limiter.Source
	total   atomic.Int64
	late    atomic.Int64 // answers after the caller's deadline
	worst   atomic.Int64 // the latest of them, ns after the deadline

	mu       sync.Mutex
	problems []string // errors, late answers, answers against the policy
}

// modes are the failure modes of the workers, in turn.
var modes = []limiter.FailureMode{limiter.FailFallback, limiter.FailAllow, limiter.FailDeny}

// workLimit is the limit of the workload's keys: never reached in a test, so
// every decision of the store admits. Its window is 30 days, so the counters
// do not roll over during a test and can be read back (and limit × window
// stays within the exact range of the Redis scripts).
var workLimit = limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1_000_000, Window: 30 * 24 * time.Hour}

// workKeys returns the keys worker i uses when each worker has n.
func workKeys(i, n int) []string {
	keys := make([]string, n)
	for j := range keys {
		keys[j] = fmt.Sprintf("worker-%d-%d", i, j)
	}
	return keys
}

// startWorkload starts the workers; each cycles through keys keys of its
// own with the failure mode modes[i%3].
func startWorkload(fs *failsoft.Limiter, keys int) *workload {
	w := &workload{fs: fs, stop: make(chan struct{})}
	for i := 0; i < workers; i++ {
		mode := modes[i%len(modes)]
		reqs := make([]limiter.Request, 0, keys)
		for _, k := range workKeys(i, keys) {
			reqs = append(reqs, limiter.Request{Key: k, Limit: workLimit, Hits: 1, FailureMode: mode})
		}
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			tick := time.NewTicker(pace)
			defer tick.Stop()
			for j := 0; ; j++ {
				select {
				case <-w.stop:
					return
				case <-tick.C:
				}
				w.check(reqs[j%len(reqs)])
			}
		}()
	}
	return w
}

// check runs one Check and records what is wrong with its answer.
func (w *workload) check(req limiter.Request) limiter.Result {
	res := make([]limiter.Result, 1)
	ctx, cancel := withCallerDeadline(envoyTimeout)
	deadline, _ := ctx.Deadline()
	err := w.fs.Check(ctx, []limiter.Request{req}, res)
	if ctx.Err() != nil {
		// Not asserted here: with 2 shared cores under -race a goroutine
		// can stall for longer than the whole deadline even on a decision
		// that does no I/O (see TestLatencyGivesUpBeforeDeadline and
		// checkDeadlines for the deterministic properties).
		w.late.Add(1)
		if over := int64(time.Since(deadline)); over > w.worst.Load() {
			w.worst.Store(over)
		}
	}
	cancel()
	w.total.Add(1)
	var problem string
	r := res[0]
	switch {
	case err != nil && errors.Is(err, context.DeadlineExceeded) && !time.Now().Before(deadline):
		// The caller's deadline passed before Check could ask the store
		// (the goroutine stalled, as above): Check says so, as documented,
		// and nobody is there to answer. Counted in late.
	case err != nil:
		problem = fmt.Sprintf("%v: Check failed: %v", req.FailureMode, err)
	case r.Source == limiter.SourceStore:
		if !r.Allowed {
			problem = fmt.Sprintf("store denied %+v", r)
		}
	case req.FailureMode == limiter.FailFallback:
		if r.Source != limiter.SourceFallback || !r.Allowed {
			problem = fmt.Sprintf("fallback mode answered %+v", r)
		}
	case req.FailureMode == limiter.FailAllow:
		if r.Source != limiter.SourceFailAllow || !r.Allowed {
			problem = fmt.Sprintf("allow mode answered %+v", r)
		}
	case req.FailureMode == limiter.FailDeny:
		if r.Source != limiter.SourceFailDeny || r.Allowed || r.RetryAfter < time.Second {
			problem = fmt.Sprintf("deny mode answered %+v", r)
		}
	}
	if err == nil && int(r.Source) < len(w.sources) {
		w.sources[r.Source].Add(1)
	}
	if problem != "" {
		w.mu.Lock()
		if len(w.problems) < 20 {
			w.problems = append(w.problems, problem)
		}
		w.mu.Unlock()
	}
	return r
}

func (w *workload) degraded() int64 {
	return w.sources[limiter.SourceFallback].Load() + w.sources[limiter.SourceFailAllow].Load() +
		w.sources[limiter.SourceFailDeny].Load()
}

// finish stops the workers and reports what went wrong; only the first call
// does anything, so it may also be deferred.
func (w *workload) finish(t *testing.T) {
	t.Helper()
	w.once.Do(func() { w.report(t) })
}

func (w *workload) report(t *testing.T) {
	t.Helper()
	close(w.stop)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.problems {
		t.Error(p)
	}
	t.Logf("%d checks: store %d, fallback %d, allow %d, deny %d; %d answered after the deadline (worst by %v)",
		w.total.Load(), w.sources[limiter.SourceStore].Load(), w.sources[limiter.SourceFallback].Load(),
		w.sources[limiter.SourceFailAllow].Load(), w.sources[limiter.SourceFailDeny].Load(),
		w.late.Load(), time.Duration(w.worst.Load()))
}

func runOutage(t *testing.T, f fault) {
	r := testenv.RedisServer(t)
	addr := r.Addr
	var px *proxy
	if f.viaProxy {
		px = newProxy(t, r.Addr)
		addr = px.Addr
	}
	if err := r.Client().Ping(context.Background()).Err(); err != nil {
		t.Fatalf("ping %s: %v", r.Addr, err)
	}
	base, _ := ownGoroutines()

	rb, err := redisbackend.New(redisbackend.Options{URL: "redis://" + addr, PoolSize: poolSize})
	if err != nil {
		t.Fatal(err)
	}
	fb := memorybackend.New(memorybackend.Options{})
	rec := newRecorder()
	logger, logs := newLogs(t)
	primary := newBySpy(rb) // given its deadline by CheckBy, as serve's store is
	fs := newFailsoft(t, failsoft.Options{
		Primary:           primary,
		Fallback:          fb,
		Heartbeat:         rb,
		HeartbeatInterval: 50 * time.Millisecond,
		Observer:          rec,
		Logger:            logger,
	})
	runCtx, stopRun := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- fs.Run(runCtx) }()

	w := startWorkload(fs, 1)
	defer w.finish(t)
	if !poll(20*time.Second, func() bool {
		return fs.State() == "closed" && w.sources[limiter.SourceStore].Load() > 100
	}) {
		t.Fatalf("the store never decided before the fault (breaker %q)", fs.State())
	}

	_, before, _ := rec.snapshot()
	f.inject(t, r, px)
	// The breaker opens, and at least one half-open probe fails and opens it
	// again: every one of those Checks is answered in time by the policy.
	reopened := func() bool {
		_, states, _ := rec.snapshot()
		n := 0
		for _, s := range states[len(before):] {
			if s == "open" {
				n++
			}
		}
		return n >= 2
	}
	if !poll(20*time.Second, reopened) {
		_, states, errs := rec.snapshot()
		t.Fatalf("breaker states %v (errors %v): want open, half-open, open under the fault", states, errs)
	}
	if w.degraded() == 0 || !fs.FallbackActive() {
		t.Errorf("no answer by failure mode during the fault (FallbackActive %v)", fs.FallbackActive())
	}

	f.heal(t, r, px)
	probe := limiter.Request{Key: "probe", Limit: limiter.Limit{Requests: 1_000_000, Window: time.Minute}, Hits: 1}
	if !poll(20*time.Second, func() bool { return w.check(probe).Source == limiter.SourceStore }) {
		_, states, _ := rec.snapshot()
		t.Fatalf("decisions did not return to the store after healing (breaker %v)", states)
	}
	storeBefore := w.sources[limiter.SourceStore].Load()
	if !poll(20*time.Second, func() bool {
		return fs.State() == "closed" && w.sources[limiter.SourceStore].Load() > storeBefore+100
	}) {
		t.Errorf("breaker %q after healing, want closed with the store deciding", fs.State())
	}
	w.finish(t)
	calls := primary.take()
	checkDeadlines(t, calls, failsoft.DefaultDeadlineMargin, true)
	if len(calls) >= int(w.total.Load()) {
		t.Errorf("the store was asked %d times for %d checks: the open breaker should keep calls away", len(calls), w.total.Load())
	}

	// Transitions, not requests, are logged and reported: every outage
	// (the breaker leaving closed) is logged once when it starts and once
	// when it ends. A loaded machine may add a short outage of its own
	// (a healthy Redis missing the 18 ms), which is reported the same way.
	fallback, states, errs := rec.snapshot()
	t.Logf("breaker states %v; store errors %v", states, errs)
	outages := 0
	for i, a := range fallback {
		if a != (i%2 == 0) {
			t.Errorf("Observer.FallbackActive calls %v: want alternating true, false", fallback)
			break
		}
		if a {
			outages++
		}
	}
	if len(fallback) == 0 || len(fallback)%2 != 0 {
		t.Errorf("Observer.FallbackActive calls %v: want at least one outage, ended", fallback)
	}
	if a, b := logs.count("store unavailable: deciding by failure_mode"), logs.count("store recovered"); a != outages || b != outages {
		t.Errorf("logged %d outage starts and %d recoveries for %d outages (%d answers by failure mode), want one each per outage",
			a, b, outages, w.degraded())
	}
	if states[len(states)-1] != "closed" {
		t.Errorf("last breaker state %q, want closed", states[len(states)-1])
	}
	if !poll(10*time.Second, func() bool { return len(r.Clients(t)) <= poolSize }) {
		t.Errorf("%d client connections on Redis, want at most the pool size %d", len(r.Clients(t)), poolSize)
	}

	stopRun()
	if err := <-runDone; err != nil {
		t.Errorf("Run: %v", err)
	}
	_ = rb.Close()
	_ = fb.Close()
	settleGoroutines(t, base)
}

// TestLatencyGivesUpBeforeDeadline: Redis answers 200 ms late. Each Check,
// made one at a time under Envoy's 20 ms deadline, returns no error, by the
// request's failure mode; the store is asked with the deadline less the
// margin and gives up (it does not wait for the late reply), which leaves
// the margin for the answer. (Whether the answer then lands within the
// margin is the machine's scheduling: it is logged, not asserted, since a
// loaded 2-core machine running the suite in parallel missed it.) After
// the latency is removed, the store decides again. Both ways
// of giving the store its deadline: CheckBy (the Backend's, serve's path) and
// a derived context (a primary without CheckBy), each with the Backend's
// calls coalesced and not.
func TestLatencyGivesUpBeforeDeadline(t *testing.T) {
	for _, by := range []bool{true, false} {
		for _, senders := range []int{0, -1} {
			t.Run(fmt.Sprintf("CheckBy=%v/senders=%d", by, senders), func(t *testing.T) {
				latencyGivesUpBeforeDeadline(t, by, senders)
			})
		}
	}
}

func latencyGivesUpBeforeDeadline(t *testing.T, by bool, senders int) {
	r := testenv.RedisServer(t)
	px := newProxy(t, r.Addr)
	rb := newRedisBackend(t, redisbackend.Options{URL: "redis://" + px.Addr, PoolSize: poolSize, Senders: senders})
	var primary interface {
		limiter.Limiter
		take() []spyCall
	} = &spy{next: rb}
	if by {
		primary = newBySpy(rb)
	}
	rec := newRecorder()
	fs := newFailsoft(t, failsoft.Options{Primary: primary, Fallback: newMemory(t, nil), Observer: rec})
	reqs := make([]limiter.Request, len(modes))
	for i, m := range modes {
		reqs[i] = limiter.Request{Key: fmt.Sprintf("key-%d", i), Limit: limiter.Limit{Requests: 1_000_000, Window: time.Minute},
			Hits: 1, FailureMode: m}
	}
	late := 0 // answers after the caller's deadline
	check := func(req limiter.Request) limiter.Result {
		t.Helper()
		res := make([]limiter.Result, 1)
		ctx, cancel := withCallerDeadline(envoyTimeout)
		defer cancel()
		if err := fs.Check(ctx, []limiter.Request{req}, res); err != nil {
			t.Fatalf("%v: Check: %v", req.FailureMode, err)
		}
		if ctx.Err() != nil {
			late++ // scheduling on a loaded machine: reported, not asserted
		}
		return res[0]
	}
	if !poll(10*time.Second, func() bool { return check(reqs[0]).Source == limiter.SourceStore }) {
		t.Fatal("the store never decided")
	}
	primary.take()

	px.add(t, "latency", "downstream", map[string]any{"latency": 200})
	want := []limiter.Source{limiter.SourceFallback, limiter.SourceFailAllow, limiter.SourceFailDeny}
	probes := func() int { // half-open probes that failed under the latency
		_, states, _ := rec.snapshot()
		n := 0
		for i := 1; i < len(states); i++ {
			if states[i-1] == "half-open" && states[i] == "open" {
				n++
			}
		}
		return n
	}
	checks := 0
	tick := time.NewTicker(pace) // load shaping: a tight loop would starve the machine
	defer tick.Stop()
	for deadline := time.Now().Add(20 * time.Second); probes() < 1; checks++ {
		<-tick.C
		if time.Now().After(deadline) {
			_, states, _ := rec.snapshot()
			t.Fatalf("breaker states %v after %d checks: want a failed half-open probe", states, checks)
		}
		i := checks % len(reqs)
		got := check(reqs[i])
		if got.Source != want[i] || got.Allowed == (want[i] == limiter.SourceFailDeny) {
			t.Fatalf("%v under latency: %+v, want source %v", reqs[i].FailureMode, got, want[i])
		}
	}
	calls := primary.take()
	checkDeadlines(t, calls, failsoft.DefaultDeadlineMargin, by)
	for _, c := range calls {
		if c.err == nil {
			t.Errorf("the store answered through a 200 ms latency within the deadline: Check waited for it")
		}
	}
	t.Logf("%d checks under latency, %d reached the store, %d answers after the caller's deadline", checks, len(calls), late)

	px.remove(t, "latency")
	if !poll(10*time.Second, func() bool { return check(reqs[0]).Source == limiter.SourceStore }) {
		t.Fatalf("decisions did not return to the store (breaker %q)", fs.State())
	}
}
