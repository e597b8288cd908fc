package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/redis/go-redis/v9"
)

// pauseRedis makes redis-server hold every client's commands for d (CLIENT
// PAUSE ALL): calls sent meanwhile stay in flight and new Checks pile up
// behind them, which is what coalescing is for.
func pauseRedis(t *testing.T, r *testenv.Redis, d time.Duration) {
	t.Helper()
	if err := r.Client().ClientPause(context.Background(), d).Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
}

// TestCoalescingIsExact: four instances sharing one counter, three of them
// coalescing (two slots, one slot, two slots with a spare opened after 1 ms)
// and one sending every Check on its own, 48 goroutines each behind a Redis
// pause, admit exactly the limit; the coalescing instances decided their
// Checks in fewer calls than Checks.
func TestCoalescingIsExact(t *testing.T) {
	r := testenv.RedisServer(t)
	clock := func() time.Time { return time.UnixMilli(1_767_225_600_000) }
	var backends []*Backend
	for _, o := range []struct {
		senders    int
		spareAfter time.Duration
	}{{0, 0}, {1, 0}, {2, time.Millisecond}, {-1, 0}} {
		b, err := New(Options{URL: "redis://" + r.Addr, Now: clock, Timeout: testTimeout, Senders: o.senders, SpareAfter: o.spareAfter})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		backends = append(backends, b)
	}
	const limit = 700
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			reqs := []limiter.Request{
				{Key: key(t.Name(), "shared"), Limit: limiter.Limit{Algorithm: alg, Requests: limit, Window: time.Hour}, Hits: 1},
				{Key: key(t.Name(), "roomy"), Limit: limiter.Limit{Algorithm: alg, Requests: 1 << 20, Window: time.Hour}, Hits: 1},
			}
			coalescedExact(t, backends, reqs, limit, 1, func() { pauseRedis(t, r, 200*time.Millisecond) })
			// All or nothing: the roomy counter was consumed by the
			// admitted batches only.
			if got := used(t, backends[0], reqs[1]); got != limit {
				t.Errorf("the second counter of the batches consumed %d, want %d", got, limit)
			}
		})
	}
}

// TestCoalescedCallerDeadline: a caller whose deadline passes while its
// call is held by Redis gets limiter.ErrUnavailable wrapping
// context.DeadlineExceeded; its Check is counted at most once, and the
// Backend goes on working.
func TestCoalescedCallerDeadline(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newSingle(t, r, DefaultKeyPrefix, nil)
	req := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 100, Window: time.Hour}, Hits: 1}}
	res := make([]limiter.Result, 1)
	if err := b.Check(context.Background(), req, res); err != nil { // load the library
		t.Fatal(err)
	}
	pauseRedis(t, r, 500*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := b.Check(ctx, req, res)
	if !errors.Is(err, limiter.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Check past its deadline = %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	// After the pause: the timed-out Check may or may not have been
	// decided by Redis (its command was sent), but not twice.
	if got := used(t, b, req[0]); got != 1 && got != 2 {
		t.Errorf("%d hits counted for one admitted Check and one timed out, want 1 or 2", got)
	}
}

// TestCoalescerClose: Close while Checks wait behind a Redis pause ends them
// (the call in flight by closing its connection) with limiter.ErrUnavailable,
// returns, and later Checks fail the same way.
func TestCoalescerClose(t *testing.T) {
	r := testenv.RedisServer(t)
	b, err := New(Options{URL: "redis://" + r.Addr, Timeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	req := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 100, Window: time.Hour}, Hits: 1}}
	if err := b.Check(context.Background(), req, make([]limiter.Result, 1)); err != nil {
		t.Fatal(err)
	}
	// Longer than the test needs: only Close ends the callers' wait.
	pauseRedis(t, r, 10*time.Second)
	const callers = 8
	errs := make(chan error, callers)
	for range callers {
		go func() {
			// No deadline: only Close can end this wait.
			errs <- b.Check(context.Background(), req, make([]limiter.Result, 1))
		}()
	}
	// Close once a call is held by Redis (the warm-up was the first), so
	// that Close has a call in flight to end, not only callers to turn away.
	if err := waitFor(func() error {
		if n := b.CallStats().Calls; n < 2 {
			return fmt.Errorf("%d calls sent", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	// Ended by Close: a closed connection or a closed Backend, not a
	// timeout (go-redis's own read timeout would end the call after 3 s).
	for range callers {
		err := <-errs
		closed := errors.Is(err, net.ErrClosed) || errors.Is(err, redis.ErrClosed) || errors.Is(err, errClosed)
		if !errors.Is(err, limiter.ErrUnavailable) || !closed {
			t.Errorf("Check ended by Close = %v, want ErrUnavailable for a closed connection or Backend", err)
		}
	}
	if err := b.Check(context.Background(), req, make([]limiter.Result, 1)); !errors.Is(err, limiter.ErrUnavailable) {
		t.Errorf("Check after Close = %v, want ErrUnavailable", err)
	}
}

// coalescedExact is the load of TestCoalescingIsExact: 48 goroutines on each
// of backends send 20 Checks of reqs each, all started right after pause
// (which holds Redis so that they queue). Exactly limit are admitted on
// reqs[0]; each instance counted its Checks and, with slots calls per Check
// (the hash slots they span), decided them in exactly that many calls per
// Check without coalescing and in fewer with it, and no refund failed.
func coalescedExact(t *testing.T, backends []*Backend, reqs []limiter.Request, limit int64, slots uint64, pause func()) {
	t.Helper()
	const goroutines, each = 48, 20
	before := make([]CallStats, len(backends))
	for i, b := range backends {
		before[i] = b.CallStats()
	}
	pause()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, b := range backends {
		for range goroutines {
			wg.Go(func() {
				res := make([]limiter.Result, len(reqs))
				for range each {
					if err := b.Check(context.Background(), reqs, res); err != nil {
						t.Errorf("Check: %v", err)
						return
					}
					if res[0].Allowed {
						admitted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	if got := admitted.Load(); got != limit {
		t.Errorf("admitted %d of %d under a limit of %d", got, len(backends)*goroutines*each, limit)
	}
	for i, b := range backends {
		st := b.CallStats()
		checks, calls := st.Checks-before[i].Checks, st.Calls-before[i].Calls
		if checks != goroutines*each {
			t.Errorf("instance %d: %d Checks counted, want %d", i, checks, goroutines*each)
		}
		if b.co == nil && calls != slots*checks {
			t.Errorf("instance %d (not coalescing): %d calls for %d Checks of %d slots", i, calls, checks, slots)
		}
		if b.co != nil && calls >= slots*checks {
			t.Errorf("instance %d (coalescing): %d calls for %d Checks of %d slots", i, calls, checks, slots)
		}
		if n := b.RefundErrors(); n != 0 {
			t.Errorf("instance %d: %d refunds failed", i, n)
		}
		t.Logf("instance %d: %d Checks in %d calls", i, checks, calls)
	}
}
