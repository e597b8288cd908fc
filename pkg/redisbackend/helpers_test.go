package redisbackend

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// testTimeout bounds every call in tests: the machines running the suite are
// shared and slow under -race, and the tests assert decisions, not speed.
const testTimeout = 20 * time.Second

// prefixes hands out a fresh key prefix per Backend so that every factory
// call of the conformance suite starts with empty counters on a shared server.
type prefixes struct{ n atomic.Int64 }

func (p *prefixes) next() string { return fmt.Sprintf("t%d:", p.n.Add(1)) }

// newSingle returns a Backend on the single redis-server r, closed when the
// test ends.
func newSingle(t testing.TB, r *testenv.Redis, prefix string, now func() time.Time) *Backend {
	t.Helper()
	return newOnURL(t, "redis://"+r.Addr, prefix, now)
}

// newOnURL returns a Backend on the single node at url, closed when the test
// ends.
func newOnURL(t testing.TB, url, prefix string, now func() time.Time) *Backend {
	t.Helper()
	return openBackend(t, Options{URL: url, KeyPrefix: prefix, Now: now, Timeout: testTimeout})
}

// openBackend returns New(o), closed when the test ends; it fails the test
// when New does.
func openBackend(t testing.TB, o Options) *Backend {
	t.Helper()
	b, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// newClustered returns a Backend on the Cluster c, closed when the test ends.
func newClustered(t testing.TB, c *testenv.Cluster, prefix string, now func() time.Time) *Backend {
	t.Helper()
	return newClusteredSenders(t, c, prefix, now, 0)
}

// newClusteredSenders is newClustered with Options.Senders (-1: every
// Check's calls sent on their own, not coalesced).
func newClusteredSenders(t testing.TB, c *testenv.Cluster, prefix string, now func() time.Time, senders int) *Backend {
	t.Helper()
	return openBackend(t, Options{ClusterAddrs: c.Addrs, KeyPrefix: prefix, Now: now, Timeout: testTimeout, Senders: senders})
}

// key builds a Request.Key the way the service does.
func key(parts ...string) string {
	var b []byte
	for _, p := range parts {
		b = limiter.AppendKeyPart(b, p)
	}
	return string(b)
}

// storedState decodes the value of a window or token bucket counter: three
// little-endian 64-bit integers (state_format in lua/lib.lua), for a sliding
// window {bucket, count, count of the bucket before}.
func storedState(v string) (st [3]int64, ok bool) {
	if len(v) != 24 {
		return st, false
	}
	for i := range st {
		st[i] = int64(binary.LittleEndian.Uint64([]byte(v[8*i:])))
	}
	return st, true
}

// holdCall loads the library with a first Check of req, stops r (SIGSTOP,
// resumed when the test ends, or earlier by r.Resume), and starts a Check of
// req whose call is then held: it returns once that call has been sent, and
// the Check's error arrives on the channel when Redis answers it.
func holdCall(t *testing.T, r *testenv.Redis, b *Backend, req []limiter.Request) <-chan error {
	t.Helper()
	if err := b.Check(context.Background(), req, make([]limiter.Result, len(req))); err != nil { // load the library
		t.Fatal(err)
	}
	calls := b.CallStats().Calls
	r.Pause()
	t.Cleanup(r.Resume) // a no-op once resumed
	held := make(chan error, 1)
	go func() { held <- b.Check(context.Background(), req, make([]limiter.Result, len(req))) }()
	if err := waitFor(func() error {
		if n := b.CallStats().Calls - calls; n != 1 {
			return fmt.Errorf("%d calls sent, want 1", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return held
}

// used returns the hits counted on the counter of req, read by a Check of
// zero hits.
func used(t testing.TB, b *Backend, req limiter.Request) int64 {
	t.Helper()
	res := make([]limiter.Result, 1)
	if err := b.Check(context.Background(), []limiter.Request{{Key: req.Key, Limit: req.Limit}}, res); err != nil {
		t.Fatalf("probe: %v", err)
	}
	return int64(req.Limit.Requests - res[0].Remaining)
}

// admitAll runs goroutines on each backend until the key refuses, and returns
// the number of admitted Checks.
func admitAll(t *testing.T, backends []*Backend, req limiter.Request, perGoroutine int) int64 {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, b := range backends {
		for range 8 {
			wg.Go(func() {
				res := make([]limiter.Result, 1)
				for range perGoroutine {
					if err := b.Check(context.Background(), []limiter.Request{req}, res); err != nil {
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
	return admitted.Load()
}

// admitSlotCall makes the check call of reqs on b, as one slot's call of a
// Cluster Check, and fails the test unless it committed with every request
// admitted. It returns the call, ready for b.refund, and its results.
func admitSlotCall(t *testing.T, b *Backend, reqs []limiter.Request) (*slotCall, []limiter.Result) {
	t.Helper()
	results := make([]limiter.Result, len(reqs))
	x := &slotCall{idx: make([]int, len(reqs))}
	for i := range x.idx {
		x.idx[i] = i
	}
	x.now, x.committed, x.err = b.call(context.Background(), reqs, nil, results, nil)
	if x.err != nil || !x.committed {
		t.Fatalf("slot call: err %v, committed %v", x.err, x.committed)
	}
	for i, r := range results {
		if !r.Allowed {
			t.Fatalf("slot call: request %d denied: %+v", i, r)
		}
	}
	return x, results
}

// refundSlot runs the refund of slot call c of the batch reqs, as settle
// does, in the caller's goroutine and on its context.
func (b *Backend) refundSlot(ctx context.Context, reqs []limiter.Request, c *slotCall, results []limiter.Result) error {
	o := b.refundOrder(reqs, c, results)
	if len(o.keys) == 0 {
		return nil
	}
	return b.refund(ctx, &o)
}
