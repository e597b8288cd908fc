package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
	"github.com/redis/go-redis/v9"
)

// keysOnDistinctMasters returns n Request keys (for limit l) whose counters
// live on n different Cluster masters.
func keysOnDistinctMasters(t *testing.T, c *testenv.Cluster, l limiter.Limit, n int) []string {
	t.Helper()
	var keys []string
	used := map[string]bool{}
	for i := 0; len(keys) < n && i < 1000; i++ {
		k := key(t.Name(), strconv.Itoa(i))
		m := c.MasterForKey(baseKey(DefaultKeyPrefix, limiter.Request{Key: k, Limit: l}))
		if !used[m.Addr] {
			used[m.Addr] = true
			keys = append(keys, k)
		}
	}
	if len(keys) < n {
		t.Fatalf("found keys on %d masters, want %d", len(keys), n)
	}
	return keys
}

// rawState returns the stored state of the counter of r as Redis holds it
// (for comparing before and after a refund): a sliding log's hits by the
// instant they are logged at (batches of one instant are interchangeable,
// and a refund may leave them split differently).
func rawState(t *testing.T, c *testenv.Cluster, r limiter.Request) string {
	t.Helper()
	if r.Limit.Algorithm == limiter.SlidingLog {
		_, hits := readLog(t, c.Client(), DefaultKeyPrefix, r)
		return fmt.Sprint(hits)
	}
	v, _ := c.Client().Get(context.Background(), baseKey(DefaultKeyPrefix, r)).Result()
	return v
}

// TestClusterCrossSlotRefund: a batch spanning slots works, and when one slot
// denies while another admitted, the admitted slot is refunded: its counter
// is back where it was (raw state and a later Check's Remaining), and its
// Result reports Remaining without consumption.
func TestClusterCrossSlotRefund(t *testing.T) {
	c := testenv.RedisCluster(t)
	for _, senders := range []int{0, -1} { // coalesced (pipelined), and not
		for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog} {
			t.Run(fmt.Sprintf("senders=%d/%v", senders, alg), func(t *testing.T) {
				clock := limitertest.NewClock(time.UnixMilli(1_767_225_600_000 + 12_345))
				b := newClusteredSenders(t, c, DefaultKeyPrefix, clock.Now, senders)
				ctx := context.Background()
				l := limiter.Limit{Algorithm: alg, Requests: 10, Window: time.Minute}
				one := limiter.Limit{Algorithm: alg, Requests: 1, Window: time.Minute}
				ks := keysOnDistinctMasters(t, c, l, 3)
				a := func(hits uint64) limiter.Request { return limiter.Request{Key: ks[0], Limit: l, Hits: hits} }
				bReq := limiter.Request{Key: ks[1], Limit: one, Hits: 1}
				cReq := limiter.Request{Key: ks[2], Limit: l, Hits: 1}
				check := func(reqs ...limiter.Request) []limiter.Result {
					t.Helper()
					res := make([]limiter.Result, len(reqs))
					if err := b.Check(ctx, reqs, res); err != nil {
						t.Fatalf("Check: %v", err)
					}
					return res
				}

				// Cross-slot batch on three masters, all admitted.
				res := check(a(3), bReq, cReq)
				for i, r := range res {
					if !r.Allowed {
						t.Fatalf("cross-slot batch: request %d denied: %+v", i, r)
					}
				}
				if res[0].Remaining != 7 || res[1].Remaining != 0 || res[2].Remaining != 9 {
					t.Fatalf("cross-slot batch remaining = %d %d %d, want 7 0 9", res[0].Remaining, res[1].Remaining, res[2].Remaining)
				}

				before := check(a(0))[0].Remaining
				rawA, rawC := rawState(t, c, a(0)), rawState(t, c, cReq)

				// B (limit 1, exhausted) vetoes; A and C admitted in their slots.
				res = check(a(2), bReq, cReq)
				if !res[0].Allowed || res[1].Allowed || !res[2].Allowed {
					t.Fatalf("vetoed batch = %+v, want A and C allowed, B denied", res)
				}
				if res[0].Remaining != before || res[2].Remaining != 9 {
					t.Errorf("vetoed batch reported remaining %d and %d, want %d and 9 (no consumption)", res[0].Remaining, res[2].Remaining, before)
				}
				if got := rawState(t, c, a(0)); got != rawA {
					t.Errorf("A's stored state after the refund = %q, before %q", got, rawA)
				}
				if got := rawState(t, c, cReq); got != rawC {
					t.Errorf("C's stored state after the refund = %q, before %q", got, rawC)
				}
				if after := check(a(0))[0].Remaining; after != before {
					t.Errorf("A's remaining after the refund = %d, before %d", after, before)
				}
				if n := b.RefundErrors(); n != 0 {
					t.Errorf("%d refunds failed", n)
				}
			})
		}
	}
}

// TestClusterCoalescingIsExact: TestCoalescingIsExact on a Cluster, with
// Checks spanning two masters (so a denial on one slot refunds the other).
// Three instances, two coalescing and one not, 48 goroutines each, behind a
// pause of the first counter's master: exactly the limit is admitted, the
// second counter keeps exactly the admitted Checks' hits (every vetoed one
// was refunded), and the coalescing instances decided their Checks' slots in
// fewer calls than slots (a slot's queued groups share a call).
func TestClusterCoalescingIsExact(t *testing.T) {
	c := testenv.RedisCluster(t)
	clock := func() time.Time { return time.UnixMilli(1_767_225_600_000) }
	var backends []*Backend
	for _, senders := range []int{0, 1, -1} {
		backends = append(backends, newClusteredSenders(t, c, DefaultKeyPrefix, clock, senders))
	}
	const limit = 700
	for _, alg := range []limiter.Algorithm{limiter.SlidingWindow, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			shared := limiter.Limit{Algorithm: alg, Requests: limit, Window: time.Hour}
			roomy := limiter.Limit{Algorithm: alg, Requests: 1 << 20, Window: time.Hour}
			ks := keysOnDistinctMasters(t, c, shared, 2)
			reqs := []limiter.Request{{Key: ks[0], Limit: shared, Hits: 1}, {Key: ks[1], Limit: roomy, Hits: 1}}
			m := c.MasterForKey(baseKey(DefaultKeyPrefix, reqs[0]))
			coalescedExact(t, backends, reqs, limit, 2, func() {
				if err := m.Client().ClientPause(context.Background(), 200*time.Millisecond).Err(); err != nil {
					t.Fatalf("CLIENT PAUSE: %v", err)
				}
			})
			if got := used(t, backends[0], reqs[1]); got != limit {
				t.Errorf("the second counter keeps %d hits, want %d (the admitted Checks')", got, limit)
			}
		})
	}
}

// TestClusterChecksOfChangingShapes: one caller at a time, so that the
// coalescer's pooled job (and its slot calls, kept from one Check to the
// next) is reused, sends Checks of 3, 1, 3 (one slot vetoing), 5, 1 and 2
// slots on a Cluster, coalesced. Every Result matches what the limits
// allow: a vetoed Check consumes nothing, and its admitted slots report the
// figures without consumption (the slot calls' alt figures, kept or
// dropped as the shapes change).
func TestClusterChecksOfChangingShapes(t *testing.T) {
	c := testenv.RedisCluster(t)
	b := newClustered(t, c, DefaultKeyPrefix, nil)
	ctx := context.Background()
	l := limiter.Limit{Requests: 100, Window: time.Hour}
	one := limiter.Limit{Requests: 1, Window: time.Hour}
	// Five keys on five distinct slots.
	var ks []string
	slots := map[int]bool{}
	for i := 0; len(ks) < 5; i++ {
		k := key(t.Name(), strconv.Itoa(i))
		if s := slot(baseKey(DefaultKeyPrefix, limiter.Request{Key: k, Limit: l})); !slots[s] {
			slots[s] = true
			ks = append(ks, k)
		}
	}
	counted := map[string]uint64{} // hits counted per key (limit l)
	req := func(i int) limiter.Request { return limiter.Request{Key: ks[i], Limit: l, Hits: 1} }
	veto := limiter.Request{Key: key(t.Name(), "veto"), Limit: one, Hits: 2} // more than its limit: denied
	steps := []struct {
		name   string
		reqs   []limiter.Request
		vetoed bool
	}{
		{"3 slots", []limiter.Request{req(0), req(1), req(2)}, false},
		{"1 slot", []limiter.Request{req(0)}, false},
		{"3 slots, one vetoing", []limiter.Request{veto, req(0), req(1)}, true},
		{"5 slots", []limiter.Request{req(0), req(1), req(2), req(3), req(4)}, false},
		{"1 slot again", []limiter.Request{req(1)}, false},
		{"2 slots", []limiter.Request{req(4), req(3)}, false},
	}
	for _, st := range steps {
		res := make([]limiter.Result, len(st.reqs))
		if err := b.Check(ctx, st.reqs, res); err != nil {
			t.Fatalf("%s: Check: %v", st.name, err)
		}
		for i, r := range st.reqs {
			if r.Key == veto.Key {
				if res[i].Allowed {
					t.Errorf("%s: the vetoing request was admitted: %+v", st.name, res[i])
				}
				continue
			}
			if !st.vetoed {
				counted[r.Key]++
			}
			want := l.Requests - counted[r.Key]
			if !res[i].Allowed || res[i].Remaining != want {
				t.Errorf("%s: request %d: allowed %v, remaining %d; want allowed, remaining %d", st.name, i, res[i].Allowed, res[i].Remaining, want)
			}
		}
	}
	for i := range ks {
		if got, want := used(t, b, req(i)), int64(counted[ks[i]]); got != want {
			t.Errorf("key %d: %d hits counted, want %d", i, got, want)
		}
	}
}

// TestClusterRefundAfterTimeout: when one master does not answer before the
// Check's deadline, the slot that consumed on another master is refunded
// all the same: the refund runs on a context of its own, after the caller
// has been answered, and Close waits for it. Before, it ran on the Check's
// expired context and failed, and the counter kept the hits of a Check that
// was not admitted.
func TestClusterRefundAfterTimeout(t *testing.T) {
	c := testenv.RedisCluster(t)
	for _, senders := range []int{0, -1} { // coalesced (pipelined), and not
		t.Run(fmt.Sprintf("senders=%d", senders), func(t *testing.T) {
			b := newClusteredSenders(t, c, DefaultKeyPrefix, nil, senders)
			l := limiter.Limit{Requests: 10, Window: time.Hour}
			ks := keysOnDistinctMasters(t, c, l, 2)
			reqs := []limiter.Request{{Key: ks[0], Limit: l, Hits: 1}, {Key: ks[1], Limit: l, Hits: 1}}
			if err := b.Check(context.Background(), reqs, make([]limiter.Result, 2)); err != nil { // load the scripts, open the connections
				t.Fatal(err)
			}
			stopped := c.MasterForKey(baseKey(DefaultKeyPrefix, reqs[1]))
			stopped.Pause()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			err := b.Check(ctx, reqs, make([]limiter.Result, 2))
			cancel()
			stopped.Resume()
			if !errors.Is(err, limiter.ErrUnavailable) {
				t.Fatalf("Check with a stopped master = %v, want ErrUnavailable", err)
			}
			probe := closeRefunded(t, b, c, DefaultKeyPrefix)
			if got := used(t, probe, reqs[0]); got != 1 {
				t.Errorf("the first master's counter keeps %d hits, want 1 (the warm-up's; the failed Check's refunded)", got)
			}
		})
	}
}

// heldRefunds is a go-redis hook that holds every refund script call (an
// EVALSHA of sha) until release is closed, or for hold at most, and counts
// the refunds it held and those of them that have ended.
type heldRefunds struct {
	sha         string
	release     <-chan struct{}
	hold        time.Duration
	held, ended *atomic.Int32
}

func (h heldRefunds) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h heldRefunds) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h heldRefunds) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) < 2 || fmt.Sprint(a[1]) != h.sha {
			return next(ctx, cmd)
		}
		h.held.Add(1)
		defer h.ended.Add(1)
		hold := time.NewTimer(h.hold)
		defer hold.Stop()
		select {
		case <-h.release:
		case <-hold.C:
		}
		return next(ctx, cmd)
	}
}

// TestClusterCheckDoesNotWaitForSlowRefund: a Cluster Check whose slot
// vetoed returns by its own deadline while the refund of the slot that
// consumed is still running, and the refund goes on to its end (Close waits
// for it): settle waits for refunds until the caller's context ends, not
// longer. Nothing else tested it (a review's finding: without the
// ctx.Done case in settle every Cluster test passed). The refund is held
// until the Check has returned (or for 5 s, so that a Check that waits for
// it fails instead of hanging), so the test asserts an order, not a speed:
// the refund must not have ended when the Check, given 200 ms, returns.
// Only a Check delayed past the 5 s hold could fail it with settle right.
func TestClusterCheckDoesNotWaitForSlowRefund(t *testing.T) {
	c := testenv.RedisCluster(t)
	for _, senders := range []int{0, -1} { // coalesced (pipelined), and not
		t.Run(fmt.Sprintf("senders=%d", senders), func(t *testing.T) {
			prefix := fmt.Sprintf("slowrefund%d:", -senders)
			b := newClusteredSenders(t, c, prefix, nil, senders)
			roomy := limiter.Limit{Requests: 10, Window: time.Hour}
			one := limiter.Limit{Requests: 1, Window: time.Hour}
			ks := keysOnDistinctMasters(t, c, roomy, 2)
			full := limiter.Request{Key: ks[1], Limit: one, Hits: 1}
			if err := b.Check(context.Background(), []limiter.Request{full}, make([]limiter.Result, 1)); err != nil {
				t.Fatal(err)
			}
			release := make(chan struct{})
			releaseOnce := sync.OnceFunc(func() { close(release) })
			t.Cleanup(releaseOnce) // before b's Close, registered earlier
			const hold = 5 * time.Second
			h := heldRefunds{sha: b.scripts.refund.Hash(), release: release, hold: hold, held: new(atomic.Int32), ended: new(atomic.Int32)}
			b.cluster.AddHook(h)

			reqs := []limiter.Request{{Key: ks[0], Limit: roomy, Hits: 1}, full}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			start := time.Now()
			res := make([]limiter.Result, 2)
			err := b.Check(ctx, reqs, res)
			took := time.Since(start)
			ended := h.ended.Load()
			releaseOnce()
			if err != nil || res[1].Allowed {
				t.Fatalf("Check = %v, %+v; want the full slot's denial", err, res)
			}
			if ended != 0 {
				t.Errorf("the Check returned after %v, once its refund (held until the Check returned, or %v) had ended: it waited for the refund past its 200 ms deadline", took.Round(time.Millisecond), hold)
			}
			probe := closeRefunded(t, b, c, prefix) // Close waits for the refund
			if n := h.held.Load(); n == 0 {
				t.Fatal("no refund was sent")
			} else if e := h.ended.Load(); e != n {
				t.Errorf("Close returned with %d of %d refunds still running", n-e, n)
			}
			if got := used(t, probe, reqs[0]); got != 0 {
				t.Errorf("the admitted slot keeps %d hits of the vetoed Check, want 0 (refunded)", got)
			}
		})
	}
}

// TestClusterAbandonedCheckIsSettled: a caller that stops waiting while its
// Cluster Check is in a coalesced call leaves it to the call's leader,
// which refunds the slot that consumed when another vetoed, as the caller
// would have. Before, nobody settled an abandoned Check, and its admitted
// slots kept their hits.
func TestClusterAbandonedCheckIsSettled(t *testing.T) {
	c := testenv.RedisCluster(t)
	b := newClusteredSenders(t, c, DefaultKeyPrefix, nil, 1)
	roomy := limiter.Limit{Requests: 10, Window: time.Hour}
	one := limiter.Limit{Requests: 1, Window: time.Hour}
	ks := keysOnDistinctMasters(t, c, roomy, 2)
	full := limiter.Request{Key: ks[1], Limit: one, Hits: 1}
	if err := b.Check(context.Background(), []limiter.Request{full}, make([]limiter.Result, 1)); err != nil {
		t.Fatal(err)
	}
	reqs := []limiter.Request{{Key: ks[0], Limit: roomy, Hits: 1}, full}

	// The job of a Check whose caller gave up once a leader had taken it
	// into a call, led by another caller.
	co := b.co
	j := co.pool.Get().(*job)
	j.encode(b, reqs)
	j.ctx = context.Background()
	j.state.Store(jobPending)
	if len(j.calls) != 2 {
		t.Fatalf("the Check has %d slot calls, want 2", len(j.calls))
	}
	if !j.abandon(reqs) {
		t.Fatal("abandon of a pending job = false")
	}
	co.mu.Lock()
	bt := co.takeIdle(co.clock())
	if bt == nil {
		co.mu.Unlock()
		t.Fatal("no idle slot")
	}
	co.lead(bt, j) // returns without co.mu

	probe := closeRefunded(t, b, c, DefaultKeyPrefix)
	if got := used(t, probe, reqs[0]); got != 0 {
		t.Errorf("the admitted slot keeps %d hits of the vetoed, abandoned Check, want 0", got)
	}
	if got := used(t, probe, full); got != 1 {
		t.Errorf("the vetoing counter has %d hits, want 1", got)
	}
}

// closeRefunded closes b, which waits for its refunds, fails the test if a
// refund failed, and returns a Backend on the Cluster c with the same key
// prefix that sends every Check on its own, to read the counters with.
func closeRefunded(t *testing.T, b *Backend, c *testenv.Cluster, prefix string) *Backend {
	t.Helper()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if n := b.RefundErrors(); n != 0 {
		t.Errorf("%d refunds failed, want 0", n)
	}
	return newClusteredSenders(t, c, prefix, nil, -1)
}
