package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// sameSlotKeys returns two Request keys whose counters (for limit l, under
// prefix) are two keys of one hash slot: their hash tags differ, so it
// searches for two that collide modulo 16384 (a few hundred tries).
func sameSlotKeys(t *testing.T, prefix string, l limiter.Limit) (a, b string) {
	t.Helper()
	seen := map[int]string{}
	for i := range 100_000 {
		k := key(t.Name(), strconv.Itoa(i))
		s := slot(baseKey(prefix, limiter.Request{Key: k, Limit: l}))
		if o, ok := seen[s]; ok {
			return o, k
		}
		seen[s] = k
	}
	t.Fatal("no two keys in one hash slot")
	return "", ""
}

// slotMigration is the migration of one hash slot of a Cluster from the
// master that serves it (src) to another (dst), as redis-cli --cluster
// reshard makes it, step by step.
type slotMigration struct {
	c            *testenv.Cluster
	slot         int
	src, dst     *testenv.Redis
	srcID, dstID string
}

// migrateSlot puts the hash slot of key into migration from its master to
// the next master: CLUSTER SETSLOT IMPORTING on the target, then MIGRATING
// on the source. Until move has moved some of the slot's keys and not all,
// nothing changes for a client.
func migrateSlot(t *testing.T, c *testenv.Cluster, key string) *slotMigration {
	t.Helper()
	ctx := context.Background()
	m := &slotMigration{c: c, slot: slot(key), src: c.MasterForKey(key)}
	for i, n := range c.Masters {
		if n == m.src {
			m.dst = c.Masters[(i+1)%len(c.Masters)]
		}
	}
	var err error
	if m.srcID, err = m.src.Client().ClusterMyID(ctx).Result(); err != nil {
		t.Fatalf("CLUSTER MYID: %v", err)
	}
	if m.dstID, err = m.dst.Client().ClusterMyID(ctx).Result(); err != nil {
		t.Fatalf("CLUSTER MYID: %v", err)
	}
	if err := m.dst.Client().Do(ctx, "cluster", "setslot", m.slot, "importing", m.srcID).Err(); err != nil {
		t.Fatalf("CLUSTER SETSLOT %d IMPORTING: %v", m.slot, err)
	}
	if err := m.src.Client().Do(ctx, "cluster", "setslot", m.slot, "migrating", m.dstID).Err(); err != nil {
		t.Fatalf("CLUSTER SETSLOT %d MIGRATING: %v", m.slot, err)
	}
	return m
}

// move moves keys from the source to the target (MIGRATE). It may run on
// any goroutine.
func (m *slotMigration) move(ctx context.Context, keys ...string) error {
	host, port, _ := strings.Cut(m.dst.Addr, ":")
	for _, k := range keys {
		if err := m.src.Client().Migrate(ctx, host, port, k, 0, 5*time.Second).Err(); err != nil {
			return fmt.Errorf("MIGRATE %s: %w", k, err)
		}
	}
	return nil
}

// finish ends the migration: the slot is the target's, on every master
// (CLUSTER SETSLOT NODE, the target first). It may run on any goroutine.
func (m *slotMigration) finish(ctx context.Context) error {
	masters := []*testenv.Redis{m.dst, m.src}
	for _, n := range m.c.Masters {
		if n != m.src && n != m.dst {
			masters = append(masters, n)
		}
	}
	for _, n := range masters {
		if err := n.Client().Do(ctx, "cluster", "setslot", m.slot, "node", m.dstID).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER SETSLOT %d NODE: %w", n.Addr, m.slot, err)
		}
	}
	return nil
}

// finishOnResend runs call and, in another goroutine, once b has resent a
// call after TRYAGAIN (its TryAgainRetries has grown), moves keys to the
// target and finishes m. It returns the error of call and that of the
// goroutine, which fails when call returned before any resend.
func finishOnResend(b *Backend, m *slotMigration, keys []string, call func() error) (err, ferr error) {
	before := b.CallStats().TryAgainRetries
	returned := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for b.CallStats().TryAgainRetries == before {
				select {
				case <-tick.C:
				case <-returned:
					if b.CallStats().TryAgainRetries == before {
						return errors.New("the call returned without a resend after TRYAGAIN")
					}
				}
			}
			ctx := context.Background()
			if err := m.move(ctx, keys...); err != nil {
				return err
			}
			return m.finish(ctx)
		}()
	}()
	err = call()
	close(returned)
	return err, <-done
}

// TestClusterTryAgain: a Check whose counters are two keys of one hash slot
// that is migrating between masters, one key moved and the other not, is
// refused with TRYAGAIN (by the source, which has one key of the two).
// Without resends (as before) the Check fails. With them it is resent,
// after a wait each time, within its deadline (a Check of 300 ms fails by
// then), and once the migration completes (in another goroutine, after the
// first resend) it succeeds with exact counts: the refused calls counted
// nothing. A refund of those two keys during another migration of the slot
// is resent the same way. Coalesced (pipelined) and not.
func TestClusterTryAgain(t *testing.T) {
	c := testenv.RedisCluster(t)
	for _, senders := range []int{0, -1} {
		t.Run(fmt.Sprintf("senders=%d", senders), func(t *testing.T) {
			ctx := context.Background()
			prefix := fmt.Sprintf("tryagain%d:", senders+1)
			fixed := time.UnixMilli(1_767_225_600_000)
			clock := func() time.Time { return fixed }
			l := limiter.Limit{Requests: 10, Window: time.Hour}
			ka, kb := sameSlotKeys(t, prefix, l)
			reqs := []limiter.Request{{Key: ka, Limit: l, Hits: 1}, {Key: kb, Limit: l, Hits: 1}}
			keyA, keyB := baseKey(prefix, reqs[0]), baseKey(prefix, reqs[1])
			open := func(timeout time.Duration, retries int) *Backend {
				b := openBackend(t, Options{ClusterAddrs: c.Addrs, KeyPrefix: prefix, Now: clock, Timeout: timeout, Senders: senders})
				b.tryAgainRetries = retries
				return b
			}
			// Resends without a bound but the Check's deadline.
			b := open(testTimeout, 1<<30)
			check := func(b *Backend) ([]limiter.Result, error) {
				res := make([]limiter.Result, len(reqs))
				return res, b.Check(ctx, reqs, res)
			}
			wantCounted := func(n int64) {
				t.Helper()
				for i, r := range reqs {
					if got := used(t, b, r); got != n {
						t.Errorf("counter %d: %d hits counted, want %d", i, got, n)
					}
				}
			}

			// Counted once before the migration, as one slot's call, kept
			// for a refund at the end.
			admitted, admittedRes := admitSlotCall(t, b, reqs)
			m := migrateSlot(t, c, keyA)
			if err := m.move(ctx, keyB); err != nil {
				t.Fatal(err)
			}

			// Without resends, the Check fails.
			b0 := open(testTimeout, 0)
			if _, err := check(b0); !errors.Is(err, limiter.ErrUnavailable) || !isTryAgain(err) {
				t.Fatalf("Check without resends during the migration = %v, want ErrUnavailable of TRYAGAIN", err)
			}
			if n := b0.CallStats().TryAgainRetries; n != 0 {
				t.Errorf("%d resends with none allowed", n)
			}

			// Resent until its deadline, not past it: it fails, and no
			// resend of it follows its return (counted again once the
			// migration is over, below).
			short := open(300*time.Millisecond, 1<<30)
			_, err := check(short)
			if !errors.Is(err, limiter.ErrUnavailable) {
				t.Fatalf("Check of 300 ms during the migration = %v, want ErrUnavailable", err)
			}
			shortResends := short.CallStats().TryAgainRetries
			if shortResends == 0 {
				t.Error("the Check of 300 ms was never resent")
			}

			// Resent until the migration completes.
			var res []limiter.Result
			err, ferr := finishOnResend(b, m, []string{keyA}, func() (err error) {
				res, err = check(b)
				return err
			})
			if ferr != nil {
				t.Fatal(ferr)
			}
			if err != nil {
				t.Fatalf("Check resent across the migration: %v", err)
			}
			for i, r := range res {
				if !r.Allowed || r.Remaining != l.Requests-2 {
					t.Errorf("request %d: allowed %v, remaining %d; want allowed, remaining %d", i, r.Allowed, r.Remaining, l.Requests-2)
				}
			}
			if got := c.MasterForKey(keyA); got != m.dst {
				t.Fatalf("the slot is served by %s, want %s (the migration's target)", got.Addr, m.dst.Addr)
			}
			if n := short.CallStats().TryAgainRetries; n != shortResends {
				t.Errorf("the Check of 300 ms was resent %d times after it returned", n-shortResends)
			}
			wantCounted(2)

			// A refund refused with TRYAGAIN is resent too: the first
			// call's hits go back while the slot migrates again.
			again := migrateSlot(t, c, keyA)
			if err := again.move(ctx, keyB); err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithTimeout(ctx, testTimeout)
			defer cancel()
			if err := b0.refundSlot(rctx, reqs, admitted, admittedRes); !isTryAgain(err) {
				t.Fatalf("refund without resends during the migration = %v, want TRYAGAIN", err)
			}
			err, ferr = finishOnResend(b, again, []string{keyA}, func() error {
				return b.refundSlot(rctx, reqs, admitted, admittedRes)
			})
			if ferr != nil {
				t.Fatal(ferr)
			}
			if err != nil {
				t.Fatalf("refund resent across the migration: %v", err)
			}
			wantCounted(1)
		})
	}
}

// TestTryAgainDoesNotHoldCallMates: a coalesced Cluster call refused with
// TRYAGAIN is resent until its slot's migration ends, while the Checks of
// its pipeline that Redis decided are answered at once: Y, on another slot,
// is answered while X still waits for its resend, and the migration ends
// only after that (so Y's answer cannot have waited for X's). Before, no
// job of the pipeline was answered until every resend had ended. Y's
// counter holds exactly its one hit: a call that ran is never resent.
func TestTryAgainDoesNotHoldCallMates(t *testing.T) {
	c := testenv.RedisCluster(t)
	ctx := context.Background()
	const prefix = "tryagainmates:"
	l := limiter.Limit{Requests: 10, Window: time.Hour}
	ka, kb := sameSlotKeys(t, prefix, l)
	reqsX := []limiter.Request{{Key: ka, Limit: l, Hits: 1}, {Key: kb, Limit: l, Hits: 1}}
	keyA, keyB := baseKey(prefix, reqsX[0]), baseKey(prefix, reqsX[1])
	var reqsY []limiter.Request
	for i := 0; reqsY == nil; i++ {
		r := limiter.Request{Key: key(t.Name(), "y", strconv.Itoa(i)), Limit: l, Hits: 1}
		if slot(baseKey(prefix, r)) != slot(keyA) {
			reqsY = []limiter.Request{r}
		}
	}
	b := openBackend(t, Options{ClusterAddrs: c.Addrs, KeyPrefix: prefix, Timeout: testTimeout, Senders: 1})
	b.tryAgainRetries = 1 << 20 // resent until the migration ends, within the deadline
	if err := b.Check(ctx, reqsX, make([]limiter.Result, 2)); err != nil {
		t.Fatal(err)
	}
	m := migrateSlot(t, c, keyA)
	if err := m.move(ctx, keyB); err != nil { // X's keys split: TRYAGAIN
		t.Fatal(err)
	}
	x := pendingJob(b, reqsX, time.Now().Add(testTimeout))
	y := pendingJob(b, reqsY, time.Now().Add(testTimeout))
	co := b.co
	co.mu.Lock()
	y.queued = true
	co.queue = append(co.queue, y)
	bt := co.takeIdle(co.clock())
	go co.lead(bt, x) // returns without co.mu
	<-y.done
	xDone := false
	select {
	case <-x.done:
		xDone = true
		t.Error("X was answered before Y, though its slot's migration had not ended: Y waited for X's resends")
	default:
	}
	if err := m.move(ctx, keyA); err != nil {
		t.Error(err)
	}
	if err := m.finish(ctx); err != nil {
		t.Error(err)
	}
	if !xDone {
		<-x.done
	}
	if y.lead != nil {
		t.Fatal("Y was not carried by X's call")
	}
	resY := make([]limiter.Result, 1)
	if err := b.finish(ctx, y.deadline, reqsY, y.calls, resY); err != nil || !resY[0].Allowed {
		t.Errorf("Y = %v, %+v; want admitted", err, resY[0])
	}
	resX := make([]limiter.Result, 2)
	if err := b.finish(ctx, x.deadline, reqsX, x.calls, resX); err != nil || !resX[0].Allowed || !resX[1].Allowed {
		t.Errorf("X = %v, %+v; want admitted once its slot moved", err, resX)
	}
	if n := b.CallStats().TryAgainRetries; n == 0 {
		t.Error("X was never resent")
	}
	co.put(x)
	co.put(y)
	if got := used(t, b, reqsY[0]); got != 1 {
		t.Errorf("Y's counter holds %d hits, want 1 (a call that ran was resent)", got)
	}
}

// TestClusterFollowsRedirectionsAtOnce: New's Cluster client has no retry
// backoff, so a coalesced call's pipeline follows MOVED and ASK at once.
// go-redis sleeps its MinRetryBackoff (10 ms by default, 10–30 ms in all)
// before a pipeline follows a redirection, though not before a single
// command does; a review measured a coalesced Check redirected with ASK
// during a migration at 20.9 ms against 0.3 ms alone, and 0.6 ms for both
// with the backoff off. The backoff applies to redirections alone: every
// script call is noRetry, and New's clients do not retry (MaxRetries −1).
func TestClusterFollowsRedirectionsAtOnce(t *testing.T) {
	c := testenv.RedisCluster(t)
	b := newClustered(t, c, "redirect:", nil)
	if d := b.cluster.Options().MinRetryBackoff; d != 0 {
		t.Errorf("the Cluster client's MinRetryBackoff is %v, want none: a pipeline sleeps that long before it follows MOVED or ASK", d)
	}
}

// TestTryAgainDelay: the waits before the resends after TRYAGAIN double
// from 1 ms up to 8 ms: the four default resends wait 15 ms in all, within
// Envoy's default 20 ms timeout, and a long run of resends (a slot split
// for longer) does not overflow the shift.
func TestTryAgainDelay(t *testing.T) {
	ms := time.Millisecond
	want := []time.Duration{ms, 2 * ms, 4 * ms, 8 * ms, 8 * ms, 8 * ms}
	var sum time.Duration
	for n, w := range want {
		if got := tryAgainDelay(n); got != w {
			t.Errorf("tryAgainDelay(%d) = %v, want %v", n, got, w)
		}
		if n < defaultTryAgainRetries {
			sum += tryAgainDelay(n)
		}
	}
	if sum != 15*ms {
		t.Errorf("the default resends wait %v in all, want 15ms", sum)
	}
	for _, n := range []int{63, 64, 1 << 20} {
		if got := tryAgainDelay(n); got != 8*ms {
			t.Errorf("tryAgainDelay(%d) = %v, want 8ms", n, got)
		}
	}
}
