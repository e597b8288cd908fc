package redisbackend

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// TestSpareSlot: with two sender slots and Redis held (SIGSTOP) during a
// first call, the Checks that arrive meanwhile
//   - with SpareAfter 0, start a second call at once on the other slot;
//   - with SpareAfter an hour, queue while the other slot stays idle: no
//     second call starts while the first is younger than SpareAfter;
//   - with SpareAfter 50 ms, are carried together by the spare once the
//     first call has taken that long (the spare timer lends it), counted in
//     SpareCalls.
//
// Each time, once Redis resumes, every Check succeeds and is counted once,
// and both slots are idle again.
func TestSpareSlot(t *testing.T) {
	r := testenv.RedisServer(t)
	const queued = 3
	for _, tc := range []struct {
		name       string
		spareAfter time.Duration
		// after Redis is held: the calls in flight, the queued Checks and
		// the idle slots to wait for, and the spare calls counted by then
		calls, queued, idle int
		spares              uint64
	}{
		{name: "at once", spareAfter: 0, calls: 2, queued: queued - 1, idle: 0, spares: 1},
		{name: "never", spareAfter: time.Hour, calls: 1, queued: queued, idle: 1, spares: 0},
		{name: "after", spareAfter: 50 * time.Millisecond, calls: 2, queued: 0, idle: 0, spares: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(Options{URL: "redis://" + r.Addr, Timeout: testTimeout, Senders: 2, SpareAfter: tc.spareAfter})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			req := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 100, Window: time.Hour}, Hits: 1}}
			first := holdCall(t, r, b, req)
			held := b.CallStats().Calls
			errs := make(chan error, queued)
			check := func() { errs <- b.Check(context.Background(), req, make([]limiter.Result, 1)) }
			for range queued {
				go check()
			}
			if err := waitFor(func() error {
				st := b.CallStats()
				q, idle := b.co.occupancy()
				// The held call and those started behind it.
				if n := 1 + st.Calls - held; n != uint64(tc.calls) || q != tc.queued || idle != tc.idle || st.SpareCalls != tc.spares {
					return fmt.Errorf("%d calls sent, %d Checks queued, %d slots idle, %d spare calls; want %d, %d, %d, %d",
						n, q, idle, st.SpareCalls, tc.calls, tc.queued, tc.idle, tc.spares)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			r.Resume()
			if err := <-first; err != nil {
				t.Errorf("held Check: %v", err)
			}
			for range queued {
				if err := <-errs; err != nil {
					t.Errorf("Check: %v", err)
				}
			}
			if got := used(t, b, req[0]); got != 2+queued {
				t.Errorf("%d hits counted, want %d (the warm-up and every Check once)", got, 2+queued)
			}
			if q, idle := b.co.occupancy(); q != 0 || idle != 2 {
				t.Errorf("after every Check returned: %d queued, %d slots idle; want 0 and 2", q, idle)
			}
		})
	}
}
