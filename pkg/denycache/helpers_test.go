package denycache

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
	"github.com/envoy-rls/envoy-rls/pkg/memorybackend"
)

// start is where the tests' clocks start: a Unix millisecond aligned to
// every window used, plus an odd offset.
const start = 1_767_225_600_000 + 137

// call is one Check the counting limiter passed on.
type call struct {
	at   int64 // the clock (ms) when it was passed on
	reqs []limiter.Request
	res  []limiter.Result
}

// counting is a limiter.Limiter that passes every batch to next and keeps a
// log of the calls (tests only).
type counting struct {
	next  limiter.Limiter
	clock *limitertest.Clock

	mu    sync.Mutex
	calls []call
}

func (c *counting) Check(ctx context.Context, reqs []limiter.Request, results []limiter.Result) error {
	at := c.clock.Millis()
	err := c.next.Check(ctx, reqs, results)
	if err == nil {
		c.mu.Lock()
		c.calls = append(c.calls, call{at: at, reqs: append([]limiter.Request(nil), reqs...),
			res: append([]limiter.Result(nil), results...)})
		c.mu.Unlock()
	}
	return err
}

func (c *counting) log() []call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]call(nil), c.calls...)
}

// sourced is a limiter.Limiter that reports every decision of next as taken
// by src, as the fail-soft layer does for its fallback (tests only).
type sourced struct {
	next limiter.Limiter
	src  limiter.Source
}

func (s sourced) Check(ctx context.Context, reqs []limiter.Request, results []limiter.Result) error {
	err := s.next.Check(ctx, reqs, results)
	for i := range results {
		results[i].Source = s.src
	}
	return err
}

// scripted is a limiter.Limiter that denies a key with the RetryAfter (and
// ResetAfter) set for it and admits any other, counting its calls.
type scripted struct {
	mu    sync.Mutex
	retry map[string]time.Duration
	calls int
}

func (s *scripted) Check(_ context.Context, reqs []limiter.Request, res []limiter.Result) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	for i, q := range reqs {
		if r, ok := s.retry[q.Key]; ok {
			res[i] = limiter.Result{RetryAfter: r, ResetAfter: r, Source: limiter.SourceStore}
		} else {
			res[i] = limiter.Result{Allowed: true, Remaining: 1, ResetAfter: q.Limit.Window, Source: limiter.SourceStore}
		}
	}
	return nil
}

// denyAll is a limiter.Limiter whose limits admit nothing: every request is
// denied with the window as RetryAfter and ResetAfter.
type denyAll struct{}

func (denyAll) Check(_ context.Context, reqs []limiter.Request, results []limiter.Result) error {
	for i := range reqs {
		w := reqs[i].Limit.Window
		results[i] = limiter.Result{RetryAfter: w, ResetAfter: w, Source: limiter.SourceStore}
	}
	return nil
}

// newMemory returns a memory backend deciding at clock, closed with t.
func newMemory(t testing.TB, clock *limitertest.Clock) *memorybackend.Backend {
	m := memorybackend.New(memorybackend.Options{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { m.Close() })
	return m
}

// newCache returns a Cache in front of next at clock.
func newCache(t testing.TB, next limiter.Limiter, clock *limitertest.Clock, o Options) *Cache {
	t.Helper()
	o.Now = clock.Now
	c, err := New(next, o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func check(t testing.TB, l limiter.Limiter, reqs ...limiter.Request) []limiter.Result {
	t.Helper()
	res := make([]limiter.Result, len(reqs))
	if err := l.Check(context.Background(), reqs, res); err != nil {
		t.Fatalf("Check: %v", err)
	}
	return res
}

var algorithms = []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
