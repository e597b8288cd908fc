package failsoft_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/envoy-rls/envoy-rls/pkg/failsoft"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/memorybackend"
	"github.com/envoy-rls/envoy-rls/pkg/redisbackend"
)

// recorder is an Observer that keeps every call.
type recorder struct {
	mu       sync.Mutex
	fallback []bool
	states   []string
	errs     map[string]int
}

func newRecorder() *recorder { return &recorder{errs: make(map[string]int)} }

func (r *recorder) FallbackActive(a bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fallback = append(r.fallback, a)
}

func (r *recorder) BreakerState(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.states = append(r.states, s)
}

func (r *recorder) StoreError(kind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs[kind]++
}

func (r *recorder) snapshot() (fallback []bool, states []string, errs map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	errs = make(map[string]int, len(r.errs))
	for k, v := range r.errs {
		errs[k] = v
	}
	return slices.Clone(r.fallback), slices.Clone(r.states), errs
}

// logs is a slog.Handler that keeps every record's message and also writes it
// to the test log.
type logs struct {
	t    testing.TB
	mu   *sync.Mutex
	msgs *[]string
	attr []slog.Attr
}

func newLogs(t testing.TB) (*slog.Logger, *logs) {
	h := &logs{t: t, mu: new(sync.Mutex), msgs: new([]string)}
	return slog.New(h), h
}

func (h *logs) Enabled(context.Context, slog.Level) bool { return true }

func (h *logs) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	for _, a := range h.attr {
		fmt.Fprintf(&b, " %s", a)
	}
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s", a); return true })
	h.mu.Lock()
	*h.msgs = append(*h.msgs, r.Message)
	h.mu.Unlock()
	h.t.Log(b.String())
	return nil
}

func (h *logs) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attr = append(slices.Clone(h.attr), as...)
	return &c
}

func (h *logs) WithGroup(string) slog.Handler { return h }

// count returns how often msg was logged.
func (h *logs) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range *h.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

// newRedisBackend returns a redisbackend on addr, closed when the test ends.
func newRedisBackend(t testing.TB, o redisbackend.Options) *redisbackend.Backend {
	t.Helper()
	b, err := redisbackend.New(o)
	if err != nil {
		t.Fatalf("redisbackend.New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// newMemory returns a memory backend without a sweeper, closed when the test
// ends.
func newMemory(t testing.TB, now func() time.Time) *memorybackend.Backend {
	t.Helper()
	b := memorybackend.New(memorybackend.Options{Now: now, SweepInterval: -1})
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func newFailsoft(t testing.TB, o failsoft.Options) *failsoft.Limiter {
	t.Helper()
	l, err := failsoft.New(o)
	if err != nil {
		t.Fatalf("failsoft.New: %v", err)
	}
	return l
}

// proxy is an in-process toxiproxy proxy in front of one upstream.
type proxy struct {
	p    *toxiproxy.Proxy
	Addr string
}

func newProxy(t testing.TB, upstream string) *proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "redis", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("toxiproxy: start proxy to %s: %v", upstream, err)
	}
	t.Cleanup(p.Stop)
	return &proxy{p: p, Addr: p.Listen}
}

// add adds a toxic of type typ on stream ("upstream" or "downstream").
func (p *proxy) add(t testing.TB, typ, stream string, attrs map[string]any) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"name": typ, "type": typ, "stream": stream, "attributes": attrs})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
		t.Fatalf("toxiproxy: add %s toxic: %v", typ, err)
	}
}

func (p *proxy) remove(t testing.TB, typ string) {
	t.Helper()
	if err := p.p.Toxics.RemoveToxic(context.Background(), typ); err != nil {
		t.Fatalf("toxiproxy: remove %s toxic: %v", typ, err)
	}
}

// settleGoroutines waits (bounded) until at most base goroutines run
// outside toxiproxy (ownGoroutines) and fails the test with a dump
// otherwise.
func settleGoroutines(t testing.TB, base int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, dump := ownGoroutines()
		if n <= base {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutine leak: %d running outside toxiproxy, %d before\n%s", n, base, dump)
		}
		time.Sleep(10 * time.Millisecond) // polling interval of a bounded wait, not synchronisation
	}
}

// ownGoroutines counts the goroutines that run no toxiproxy code, and
// returns the dump of all of them. Toxiproxy's own start and end on its
// schedule, not the test's: Proxy.Start returns before the proxy's server
// goroutine has started the one that waits for its stop (which made a count
// taken just after newProxy one short, and the leak check fail), and the two
// that carry a proxied connection end some time after it closes. They belong
// to the fixture, which stops them in its cleanup; the leak check is about
// the code under test.
func ownGoroutines() (int, []byte) {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.HasPrefix(g, "goroutine ") && !strings.Contains(g, "github.com/Shopify/toxiproxy") {
			count++
		}
	}
	return count, buf
}

// poll calls f every 10ms until it returns true or d passes; it reports
// whether f returned true.
func poll(d time.Duration, f func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if f() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond) // polling interval of a bounded wait
	}
}

// callerDeadline is the context key under which the tests store the
// deadline they gave Check, so that spy can compare it with the deadline
// the primary received.
type callerDeadline struct{}

// withCallerDeadline returns a context with deadline d that remembers d.
func withCallerDeadline(d time.Duration) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(d)
	ctx := context.WithValue(context.Background(), callerDeadline{}, deadline)
	return context.WithDeadline(ctx, deadline)
}

// spy passes every Check to a real limiter and records, for each call, the
// caller's deadline, the deadline the primary was given and what it returned.
// It has no CheckBy, so the Limiter derives a context per Check for it.
type spy struct {
	next limiter.Limiter

	mu    sync.Mutex
	calls []spyCall
}

type spyCall struct {
	caller, got time.Time
	// ctx is the deadline of the context the primary was given, which
	// CheckBy must receive underived (the caller's own).
	ctx time.Time
	err error
}

func (s *spy) Check(ctx context.Context, reqs []limiter.Request, results []limiter.Result) error {
	err := s.next.Check(ctx, reqs, results)
	c := spyCall{err: err}
	c.got, _ = ctx.Deadline()
	s.record(ctx, c)
	return err
}

func (s *spy) record(ctx context.Context, c spyCall) {
	c.caller, _ = ctx.Value(callerDeadline{}).(time.Time)
	c.ctx, _ = ctx.Deadline()
	s.mu.Lock()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
}

// bySpy is a spy over a redisbackend.Backend, given its deadline through
// CheckBy (a failsoft.DeadlineChecker, as serve's primary is), which it
// records as the deadline the primary got.
type bySpy struct {
	spy
	by failsoft.DeadlineChecker
}

func newBySpy(rb *redisbackend.Backend) *bySpy { return &bySpy{spy: spy{next: rb}, by: rb} }

func (s *bySpy) CheckBy(ctx context.Context, by time.Time, reqs []limiter.Request, results []limiter.Result) error {
	err := s.by.CheckBy(ctx, by, reqs, results)
	s.record(ctx, spyCall{got: by, err: err})
	return err
}

// take returns the calls recorded since the last take.
func (s *spy) take() []spyCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.calls
	s.calls = nil
	return c
}

// checkDeadlines fails the test unless every call got the caller's deadline
// less margin, and, given it by CheckBy (by), the caller's own context.
func checkDeadlines(t testing.TB, calls []spyCall, margin time.Duration, by bool) {
	t.Helper()
	for _, c := range calls {
		if c.caller.IsZero() || !c.got.Equal(c.caller.Add(-margin)) {
			t.Errorf("primary got deadline %v for a caller deadline %v, want %v earlier", c.got, c.caller, margin)
			return
		}
		if by && !c.ctx.Equal(c.caller) {
			t.Errorf("CheckBy got a context with deadline %v for a caller deadline %v: want the caller's context, not one derived", c.ctx, c.caller)
			return
		}
	}
}
