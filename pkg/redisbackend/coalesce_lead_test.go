package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// occupancy returns how many Checks are queued and how many sender slots are
// idle.
func (c *coalescer) occupancy() (queued, idle int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue), len(c.idle)
}

// newOneSlot returns a coalescing Backend on r with a single sender slot,
// closed when the test ends.
func newOneSlot(t *testing.T, r *testenv.Redis) *Backend {
	t.Helper()
	b, err := New(Options{URL: "redis://" + r.Addr, Timeout: testTimeout, Senders: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestCoalescedQueuedCancel: Checks queued behind a call held by a stopped
// Redis (SIGSTOP), whose callers cancel, return limiter.ErrUnavailable
// wrapping context.Canceled without being sent: no call carries them and
// their hits are never counted. The call in flight ends normally, and its
// slot is idle again.
func TestCoalescedQueuedCancel(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newOneSlot(t, r)
	req := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 100, Window: time.Hour}, Hits: 1}}
	held := holdCall(t, r, b, req) // SIGSTOP: its call is held until Resume
	calls := b.CallStats().Calls
	const queued = 4
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, queued)
	for range queued {
		go func() { errs <- b.Check(ctx, req, make([]limiter.Result, 1)) }()
	}
	if err := waitFor(func() error {
		if n, _ := b.co.occupancy(); n != queued {
			return fmt.Errorf("%d Checks queued, want %d", n, queued)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	cancel()
	for range queued {
		if err := <-errs; !errors.Is(err, limiter.ErrUnavailable) || !errors.Is(err, context.Canceled) {
			t.Errorf("queued Check canceled = %v, want ErrUnavailable and context.Canceled", err)
		}
	}
	if n := b.CallStats().Calls - calls; n != 0 {
		t.Errorf("%d calls sent behind the held one, want 0", n)
	}
	r.Resume()
	if err := <-held; err != nil {
		t.Fatalf("the held Check: %v", err)
	}
	if n, idle := b.co.occupancy(); n != 0 || idle != 1 {
		t.Errorf("after every Check returned: %d queued, %d slots idle; want 0 and 1", n, idle)
	}
	if got := used(t, b, req[0]); got != 2 {
		t.Errorf("%d hits counted, want 2 (the warm-up and the held Check)", got)
	}
}

// TestCoalescerWithdrawLentSlot: a caller lent a slot whose context ends
// before it leads passes the slot to the oldest queued Check, whose caller
// is woken; when that one withdraws too, the slot is idle again. So does a
// caller that wakes to the loan with its context already ended. A slot
// lent when the Backend closes is given up by its caller: Close waits for
// it, and the caller gets errClosed.
func TestCoalescerWithdrawLentSlot(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newOneSlot(t, r)
	c := b.co
	newJob := func() *job {
		j := c.pool.Get().(*job)
		j.ctx = context.Background()
		j.state.Store(jobPending)
		return j
	}
	// Lend the only slot to j1, as a leader whose call ended would, with
	// j2 queued behind it.
	lend := func(j1, j2 *job) *batch {
		c.mu.Lock()
		defer c.mu.Unlock()
		bt := c.idle[0]
		c.idle = c.idle[:0]
		c.lent.Add(1)
		j1.lead = bt
		j1.done <- struct{}{}
		j2.queued = true
		c.queue = append(c.queue, j2)
		return bt
	}
	j1, j2 := newJob(), newJob()
	bt := lend(j1, j2)
	if !c.withdraw(j1) {
		t.Fatal("withdraw of a job lent a slot = false, want true")
	}
	c.mu.Lock()
	lead, queued := j2.lead, j2.queued
	c.mu.Unlock()
	if lead != bt || queued {
		t.Fatalf("after the first caller withdrew: next job lent %p and queued %v, want %p and false", lead, queued, bt)
	}
	select {
	case <-j2.done:
		j2.done <- struct{}{} // as its caller has not read it yet
	default:
		t.Fatal("the job lent the slot was not woken")
	}
	if !c.withdraw(j2) {
		t.Fatal("withdraw of the second job = false, want true")
	}
	if n, idle := c.occupancy(); n != 0 || idle != 1 {
		t.Fatalf("after both withdrew: %d queued, %d slots idle; want 0 and 1", n, idle)
	}

	// A caller woken by the loan whose context has ended meanwhile does not
	// lead: the slot goes on to the next queued job, and no call is sent.
	// So does one whose own deadline (CheckBy's, or Options.Timeout's) has
	// passed while its context lives on: the slot can reach it an instant
	// before the expiry timer does. Leading, it would wait for a call of
	// the others' Checks, bounded by their deadlines, past its own. Both
	// jobs carry a real group, so that a regression (the first leading)
	// sends a well-formed call, and the test fails instead of hanging.
	declines := func(why string, ctx context.Context, deadline time.Time, want error) {
		t.Helper()
		first, next := newJob(), newJob()
		late := []limiter.Request{{Key: key(t.Name(), why), Limit: limiter.Limit{Requests: 100, Window: time.Hour}, Hits: 1}}
		first.encode(b, late)
		next.encode(b, late)
		first.ctx, first.deadline = ctx, deadline
		bt := lend(first, next)
		<-first.done
		first.lead = nil
		calls := b.CallStats().Calls
		if err := c.takeLead(bt, first); !errors.Is(err, want) {
			// Not fatal: the slot reached next either way, and the checks
			// below give it back, so that Close does not wait for it.
			t.Errorf("%s: takeLead = %v, want %v", why, err, want)
		}
		c.mu.Lock()
		lead := next.lead
		c.mu.Unlock()
		if lead != bt {
			t.Fatalf("%s: after the caller declined, the next job was lent %p, want %p", why, lead, bt)
		}
		if n := b.CallStats().Calls; n != calls {
			t.Errorf("%s: %d calls sent by the caller that should have declined, want 0", why, n-calls)
		}
		if !c.withdraw(next) {
			t.Fatalf("%s: withdraw of the job lent the declined slot = false, want true", why)
		}
		if n, idle := c.occupancy(); n != 0 || idle != 1 {
			t.Fatalf("%s: after the declined loan, %d queued, %d slots idle; want 0 and 1", why, n, idle)
		}
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	declines("context ended", ended, time.Time{}, context.Canceled)
	declines("deadline passed", context.Background(), time.Now().Add(-time.Millisecond), context.DeadlineExceeded)
	req := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 100, Window: time.Hour}, Hits: 1}}
	if err := b.Check(context.Background(), req, make([]limiter.Result, 1)); err != nil {
		t.Fatalf("Check after the withdrawals: %v", err)
	}

	// Close while the slot is lent to j3, whose caller has not woken.
	j3, j4 := newJob(), newJob()
	bt = lend(j3, j4)
	closed := make(chan bool, 1)
	go func() { closed <- c.close(-1) }()
	<-j4.done
	if j4.err != errClosed {
		t.Errorf("queued job at close: err %v, want errClosed", j4.err)
	}
	// j3's caller wakes: it leads, learns of the close.
	<-j3.done
	c.mu.Lock()
	j3.lead = nil
	c.lead(bt, j3)
	<-j3.done
	if j3.err != errClosed {
		t.Errorf("job lent a slot at close: err %v, want errClosed", j3.err)
	}
	if !<-closed {
		t.Error("close(-1) = false, want true")
	}
	if bt.conn != nil {
		t.Error("the lent slot kept its connection after close")
	}
}

// TestCoalescerCancelStorm: 32 goroutines send Checks whose contexts end at
// random moments (before the Check, while queued, while lent a slot, while
// in a call) on two slots, whose CheckBy deadline passes at such moments
// (answered by the coalescer's expiry while queued), or neither. Afterwards nothing is queued, both
// slots are idle, the Backend still decides, and each counter holds every
// admitted hit and no more than the Checks that may have reached Redis. On a
// Cluster each Check spans two masters, so its calls go in pipelines and a
// Check whose other slot failed is refunded (or, its context ended, left
// over-counted).
func TestCoalescerCancelStorm(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		r := testenv.RedisServer(t)
		b := newSingle(t, r, DefaultKeyPrefix, nil)
		cancelStorm(t, b, []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 1 << 30, Window: time.Hour}, Hits: 1}})
	})
	t.Run("cluster", func(t *testing.T) {
		c := testenv.RedisCluster(t)
		b := newClustered(t, c, DefaultKeyPrefix, nil)
		l := limiter.Limit{Requests: 1 << 30, Window: time.Hour}
		ks := keysOnDistinctMasters(t, c, l, 2)
		cancelStorm(t, b, []limiter.Request{{Key: ks[0], Limit: l, Hits: 1}, {Key: ks[1], Limit: l, Hits: 1}})
	})
}

func cancelStorm(t *testing.T, b *Backend, reqs []limiter.Request) {
	t.Helper()
	if err := b.Check(context.Background(), reqs, make([]limiter.Result, len(reqs))); err != nil {
		t.Fatal(err)
	}
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			res := make([]limiter.Result, len(reqs))
			for range 200 {
				var ctx context.Context
				var cancel context.CancelFunc
				var by time.Time // CheckBy's deadline; zero: none
				switch rng.IntN(5) {
				case 0: // ends before the Check
					ctx, cancel = context.WithCancel(context.Background())
					cancel()
				case 1: // ends at some point of the Check
					d := time.Duration(rng.IntN(2000)) * time.Microsecond
					ctx, cancel = context.WithTimeout(context.Background(), d)
				case 2: // CheckBy's deadline passes at some point of the Check
					ctx, cancel = context.WithCancel(context.Background())
					by = time.Now().Add(time.Duration(rng.IntN(2000)) * time.Microsecond)
				default:
					ctx, cancel = context.WithCancel(context.Background())
				}
				err := b.CheckBy(ctx, by, reqs, res)
				cancel()
				switch {
				case err == nil:
					ok.Add(1)
				// A call is bounded by the earliest deadline of its
				// Checks, and fails for all of them when it passes.
				case errors.Is(err, limiter.ErrUnavailable) && (ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded)):
					failed.Add(1)
				default:
					t.Errorf("Check = %v (context %v), want success or ErrUnavailable for an ended context or deadline", err, ctx.Err())
				}
			}
		})
	}
	wg.Wait()
	if n, idle := b.co.occupancy(); n != 0 || idle != DefaultSenders {
		t.Errorf("after the storm: %d queued, %d slots idle; want 0 and %d", n, idle, DefaultSenders)
	}
	for i := range reqs {
		got := used(t, b, reqs[i]) - 1 // the warm-up
		if got < ok.Load() || got > ok.Load()+failed.Load() {
			t.Errorf("counter %d: %d hits counted for %d admitted Checks and %d canceled ones", i, got, ok.Load(), failed.Load())
		}
		t.Logf("counter %d: %d admitted, %d canceled, %d counted", i, ok.Load(), failed.Load(), got)
	}
}

// TestSpareTimerRearmedAfterLending: with three slots, a call in flight
// older than SpareAfter and three Checks queued, the spare timer lends a
// second slot to the oldest Check and is set again for the others, so that
// they too wait no longer than SpareAfter while a slot is idle: it lends the
// third slot to the next Check without any other event (no Check arriving,
// no call ending). Before, the Checks behind a spare that stalled as well
// waited for the next arrival or the end of a call.
func TestSpareTimerRearmedAfterLending(t *testing.T) {
	r := testenv.RedisServer(t)
	b, err := New(Options{URL: "redis://" + r.Addr, Timeout: testTimeout, Senders: 3, SpareAfter: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	c := b.co
	jobs := make([]*job, 3)
	c.mu.Lock()
	// A call in flight for a second: slot a, lent out, started then.
	a := c.takeIdle(time.Now())
	if a == nil {
		c.mu.Unlock()
		t.Fatal("no idle slot at the start")
	}
	a.start = time.Now().Add(-time.Second)
	for i := range jobs {
		j := c.pool.Get().(*job)
		j.ctx = context.Background()
		j.state.Store(jobPending)
		j.queued = true
		c.queue = append(c.queue, j)
		jobs[i] = j
	}
	c.mu.Unlock()

	c.lendSpare() // as the timer does when a's call has taken SpareAfter
	<-jobs[0].done
	c.mu.Lock()
	first, armed := jobs[0].lead, c.spareArmed
	c.mu.Unlock()
	if first == nil || first == a {
		t.Fatalf("the spare timer lent %p to the oldest Check, want an idle slot", first)
	}
	if !armed {
		t.Error("the spare timer was not set again for the Checks still queued")
	}
	// The third slot reaches the next Check SpareAfter after the second
	// slot's call started, through the timer alone. (The bound only keeps
	// a regression from hanging the test: the timer is due in 20 ms.)
	woken := 1
	select {
	case <-jobs[1].done:
		woken = 2
		c.mu.Lock()
		second, queued := jobs[1].lead, len(c.queue)
		c.mu.Unlock()
		if second == nil || second == a || second == first {
			t.Errorf("the re-set timer lent %p to the next Check, want the third slot", second)
		}
		if queued != 1 {
			t.Errorf("%d Checks queued after two loans, want 1", queued)
		}
	case <-time.After(10 * time.Second):
		t.Error("the next Check got no slot while one was idle and the calls in flight were older than SpareAfter")
	}

	// Give everything back: the Checks withdraw (the lent ones with the
	// loan's signal put back, as if their callers had not read it), and a's
	// call ends.
	for i := len(jobs) - 1; i >= 0; i-- {
		if i < woken {
			jobs[i].done <- struct{}{}
		}
		if !c.withdraw(jobs[i]) {
			t.Fatalf("withdraw of Check %d = false, want true", i)
		}
	}
	c.mu.Lock()
	c.pass(a, time.Now())
	c.mu.Unlock()
	if n, idle := c.occupancy(); n != 0 || idle != 3 {
		t.Fatalf("afterwards: %d queued, %d slots idle; want 0 and 3", n, idle)
	}
}

// TestCoalescedDeadlineClasses: a call carries only Checks whose deadlines
// are not much later than its leader's (mayJoin), so that a Check with time
// left is not failed by a call-mate's short deadline. Redis is stopped while a
// leader with 300 ms left sends its call: the queued Check whose deadline
// is as near shares the call and its failure; the one with the test's
// whole timeout is left queued, is lent the slot when the call ends, and
// is decided by a call of its own once Redis answers. Before, it was
// carried, and failed, by the short call.
func TestCoalescedDeadlineClasses(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newOneSlot(t, r)
	c := b.co
	req := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 100, Window: time.Hour}, Hits: 1}}
	if err := b.Check(context.Background(), req, make([]limiter.Result, 1)); err != nil { // load the library
		t.Fatal(err)
	}
	newJob := func(deadline time.Time) *job { return pendingJob(b, req, deadline) }
	now := time.Now()
	short := newJob(now.Add(300 * time.Millisecond))
	near := newJob(short.deadline.Add(deadlineSlack / 2))
	long := newJob(now.Add(testTimeout))
	c.mu.Lock()
	for _, q := range []*job{long, near} {
		q.queued = true
		c.queue = append(c.queue, q)
	}
	bt := c.takeIdle(c.clock())
	if bt == nil {
		c.mu.Unlock()
		t.Fatal("no idle slot")
	}
	r.Pause()
	t.Cleanup(r.Resume) // a no-op once resumed
	c.lead(bt, short)   // returns without c.mu, once the call has failed
	r.Resume()

	<-short.done
	<-near.done
	for name, j := range map[string]*job{"the leader": short, "the Check of its class": near} {
		if j.err != nil || j.calls[0].err == nil {
			t.Errorf("%s: job error %v, call error %v; want the call's failure", name, j.err, j.calls[0].err)
		}
	}
	select {
	case <-long.done:
	default:
		t.Fatal("the Check with time left was neither answered nor lent the slot")
	}
	c.mu.Lock()
	lead := long.lead
	long.lead = nil
	c.mu.Unlock()
	if lead == nil {
		t.Fatalf("the Check with time left was carried by the short call (error %v), want it left queued", long.calls[0].err)
	}
	if err := c.takeLead(lead, long); err != nil {
		t.Fatalf("the Check with time left could not lead: %v", err)
	}
	<-long.done
	res := make([]limiter.Result, 1)
	if err := b.finish(context.Background(), long.deadline, req, long.calls, res); err != nil || !res[0].Allowed {
		t.Errorf("the Check with time left = %v, %+v; want admitted by its own call", err, res[0])
	}
	for _, j := range []*job{short, near, long} {
		c.put(j)
	}
}

// TestCoalescedDeadlineClassIdleSlot: a Check a leader leaves queued (it
// may not join the leader's call) is lent an idle slot at once, rather than wait for the
// leader's call to end: with two slots and Redis stopped, it leads on the
// other slot while the short call is still held.
func TestCoalescedDeadlineClassIdleSlot(t *testing.T) {
	r := testenv.RedisServer(t)
	b := openBackend(t, Options{URL: "redis://" + r.Addr, Timeout: testTimeout, Senders: 2})
	c := b.co
	req := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 100, Window: time.Hour}, Hits: 1}}
	newJob := func(deadline time.Time) *job { return pendingJob(b, req, deadline) }
	short, long := newJob(time.Now().Add(300*time.Millisecond)), newJob(time.Now().Add(testTimeout))
	c.mu.Lock()
	long.queued = true
	c.queue = append(c.queue, long)
	bt := c.takeIdle(c.clock())
	r.Pause()
	t.Cleanup(r.Resume)
	led := make(chan struct{})
	go func() {
		defer close(led)
		c.lead(bt, short)
	}()
	<-long.done // lent a slot
	c.mu.Lock()
	lead := long.lead
	long.lead = nil
	c.mu.Unlock()
	if lead == nil || lead == bt {
		t.Errorf("the Check left queued was lent slot %p, want the idle one (not the short call's %p)", lead, bt)
	}
	r.Resume()
	<-led
	<-short.done
	if lead != nil {
		if err := c.takeLead(lead, long); err != nil {
			t.Fatal(err)
		}
		<-long.done
	}
	for _, j := range []*job{short, long} {
		c.put(j)
	}
}

// TestCoalescedCallCarriesLaterArrivals: Checks of one timeout share a
// call however far apart they arrived (here 5 ms and 50 ms after the
// leader, which has 10 s left), as coalescing needs when calls take longer
// than the arrivals' spacing: a class by absolute deadline (within 1 ms of
// the leader's) carried about a millisecond of arrivals per call, and
// behind a Redis 3 ms away the queue fell behind until Checks expired in it
// (BenchmarkCheckBehindLatency: 95% failed).
func TestCoalescedCallCarriesLaterArrivals(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newOneSlot(t, r)
	c := b.co
	req := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 100, Window: time.Hour}, Hits: 1}}
	const budget = 10 * time.Second
	now := time.Now()
	jobs := make([]*job, 3)
	for i, arrived := range []time.Duration{0, 5 * time.Millisecond, 50 * time.Millisecond} {
		jobs[i] = pendingJob(b, req, now.Add(arrived+budget))
	}
	calls := b.CallStats().Calls
	c.mu.Lock()
	for _, q := range jobs[1:] {
		q.queued = true
		c.queue = append(c.queue, q)
	}
	bt := c.takeIdle(c.clock())
	c.lead(bt, jobs[0]) // returns without c.mu
	for i, j := range jobs {
		<-j.done
		if lent := j.lead; lent != nil {
			// Hand the slot back, so that Close does not wait for it.
			j.lead = nil
			c.mu.Lock()
			c.pass(lent, c.clock())
			c.mu.Unlock()
			t.Errorf("Check %d was left queued and lent the slot, want it carried by the leader's call", i)
			continue
		}
		res := make([]limiter.Result, 1)
		if err := b.finish(context.Background(), j.deadline, req, j.calls, res); err != nil || !res[0].Allowed {
			t.Errorf("Check %d = %v, %+v; want admitted", i, err, res[0])
		}
	}
	if n := b.CallStats().Calls - calls; n != 1 {
		t.Errorf("%d calls for the three Checks, want 1", n)
	}
	for _, j := range jobs {
		c.put(j)
	}
}

// TestCoalescedCallEndsNoEarlierThanItsLeader: a Check whose deadline is
// earlier than the leader's (a gateway with a shorter timeout that arrived
// meanwhile) does not join its call, which would then end at that earlier
// deadline and fail the leader with time left. With one slot and Redis
// stopped, the leader's call (800 ms left) ends at the leader's own
// deadline, and the Check with 700 ms left is answered from the queue at
// its deadline, with nothing sent.
func TestCoalescedCallEndsNoEarlierThanItsLeader(t *testing.T) {
	r := testenv.RedisServer(t)
	b := newOneSlot(t, r)
	c := b.co
	req := []limiter.Request{{Key: key(t.Name()), Limit: limiter.Limit{Requests: 100, Window: time.Hour}, Hits: 1}}
	if err := b.Check(context.Background(), req, make([]limiter.Result, 1)); err != nil { // load the library
		t.Fatal(err)
	}
	now := time.Now()
	newJob := func(left time.Duration) *job { return pendingJob(b, req, now.Add(left)) }
	leader, shorter := newJob(800*time.Millisecond), newJob(700*time.Millisecond)
	c.mu.Lock()
	shorter.queued = true
	c.queue = append(c.queue, shorter)
	c.armExpiry(shorter.deadline)
	bt := c.takeIdle(c.clock())
	r.Pause()
	t.Cleanup(r.Resume)
	c.lead(bt, leader) // returns once the call has failed
	ended := time.Now()
	r.Resume()
	<-leader.done
	<-shorter.done
	if ended.Before(leader.deadline.Add(-deadlineSlack)) {
		t.Errorf("the leader's call ended %v before the leader's deadline: a call-mate's earlier deadline bounded it", leader.deadline.Sub(ended).Round(time.Millisecond))
	}
	if shorter.lead != nil || !errors.Is(shorter.err, context.DeadlineExceeded) {
		t.Errorf("the Check with the earlier deadline: lent %v, error %v; want it answered from the queue at its deadline", shorter.lead != nil, shorter.err)
	}
	for _, j := range []*job{leader, shorter} {
		c.put(j)
	}
}

// TestMayJoin: which queued Checks may share the call of a leader with
// 300 ms left (deadlines relative to now).
func TestMayJoin(t *testing.T) {
	now := time.Now()
	at := func(d time.Duration) *job { return &job{deadline: now.Add(d)} }
	none := &job{}
	const left = 300 * time.Millisecond
	leader := at(left)
	for _, c := range []struct {
		name   string
		first  *job
		q      *job
		expect bool
	}{
		{"the same deadline", leader, at(left), true},
		{"within the slack before it", leader, at(left - deadlineSlack), true},
		{"earlier than the slack", leader, at(left - deadlineSlack - time.Microsecond), false},
		{"later by the leader's time left", leader, at(2 * left), true},
		{"later by more than the leader's time left", leader, at(2*left + time.Microsecond), false},
		// A stale leader (it waited 300 of its 450 ms in the queue) and a
		// Check of the same timeout that just arrived: apart.
		{"a fresh Check behind a stale leader", at(150 * time.Millisecond), at(450 * time.Millisecond), false},
		// A leader with almost nothing left still carries the Checks
		// within the slack of its deadline.
		{"a leader out of time, within the slack", at(-time.Millisecond), at(-time.Millisecond + deadlineSlack), true},
		{"a deadline 50 years away", leader, at(50 * 365 * 24 * time.Hour), false},
		{"no deadline behind a leader with one", leader, none, false},
		{"a deadline behind a leader without", none, leader, false},
		{"neither has a deadline", none, none, true},
	} {
		if got := mayJoin(c.first, c.q, now); got != c.expect {
			t.Errorf("%s: mayJoin = %v, want %v", c.name, got, c.expect)
		}
	}
}

// pendingJob returns a job of b's coalescer for a Check of req with
// deadline (zero: none), pending, as check makes it before it queues or
// leads.
func pendingJob(b *Backend, req []limiter.Request, deadline time.Time) *job {
	j := b.co.pool.Get().(*job)
	j.encode(b, req)
	j.ctx, j.deadline = context.Background(), deadline
	j.state.Store(jobPending)
	return j
}
