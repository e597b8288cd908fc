package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// TestCheckByEndsAtItsDeadline: CheckBy's deadline ends a Check whose
// context never ends (context.Background), with an error that wraps
// limiter.ErrUnavailable and context.DeadlineExceeded, while Redis is held
// (SIGSTOP):
//   - coalesced, with one sender slot: a Check queued behind a call in
//     flight is answered at its deadline by the coalescer's expiry, while
//     that call is still waiting for Redis, and nothing of it is sent;
//     another queued Check, without a deadline of its own, stays queued.
//     Once Redis resumes, the call in flight and the other queued Check are
//     decided, each counted once, and the expired one is not counted;
//   - not coalesced (Senders -1): the call itself ends at the deadline.
func TestCheckByEndsAtItsDeadline(t *testing.T) {
	r := testenv.RedisServer(t)
	limit := limiter.Limit{Requests: 100, Window: time.Hour}
	expired := func(t *testing.T, err error) {
		t.Helper()
		if !errors.Is(err, limiter.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("CheckBy past its deadline: %v, want limiter.ErrUnavailable and context.DeadlineExceeded", err)
		}
	}

	t.Run("queued", func(t *testing.T) {
		b := newOneSlot(t, r)
		req := []limiter.Request{{Key: key(t.Name()), Limit: limit, Hits: 1}}
		first := holdCall(t, r, b, req)
		held := b.CallStats().Calls
		other := make(chan error, 1)
		go func() { other <- b.Check(context.Background(), req, make([]limiter.Result, 1)) }()
		if err := waitFor(func() error {
			if q, _ := b.co.occupancy(); q != 1 {
				return fmt.Errorf("%d Checks queued, want 1", q)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		expired(t, b.CheckBy(context.Background(), time.Now().Add(50*time.Millisecond), req, make([]limiter.Result, 1)))
		select {
		case err := <-first:
			t.Fatalf("the call in flight ended (%v) while Redis was held: the deadline was not the expiry's doing", err)
		default:
		}
		if q, idle := b.co.occupancy(); q != 1 || idle != 0 {
			t.Errorf("after the expiry: %d Checks queued, %d slots idle; want 1 (the one without a deadline) and 0", q, idle)
		}
		if n := b.CallStats().Calls - held; n != 0 {
			t.Errorf("%d calls sent behind the held one, want 0", n)
		}
		r.Resume()
		for _, c := range []<-chan error{first, other} {
			if err := <-c; err != nil {
				t.Errorf("Check: %v", err)
			}
		}
		if got := used(t, b, req[0]); got != 3 {
			t.Errorf("%d hits counted, want 3 (the warm-up, the call in flight and the other queued Check; not the expired one)", got)
		}
	})

	t.Run("not coalesced", func(t *testing.T) {
		b, err := New(Options{URL: "redis://" + r.Addr, Timeout: testTimeout, Senders: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		req := []limiter.Request{{Key: key(t.Name()), Limit: limit, Hits: 1}}
		if err := b.Check(context.Background(), req, make([]limiter.Result, 1)); err != nil { // load the library
			t.Fatal(err)
		}
		r.Pause()
		err = b.CheckBy(context.Background(), time.Now().Add(50*time.Millisecond), req, make([]limiter.Result, 1))
		r.Resume()
		expired(t, err)
	})
}
