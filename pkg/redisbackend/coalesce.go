package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/redis/go-redis/v9"
)

// Coalescing
//
// Concurrent Checks are sent together. A Check encodes its group (keys and
// specs) in its own goroutine. The coalescer has a few sender slots
// (Options.Senders), each a call's scratch space and, on a single node or
// Sentinel, a connection of its own; a slot is either idle or lent to one
// caller, its leader, which sends one call with every group that is queued
// (up to MaxBatch requests, its own first), in which Redis decides the groups
// one after the other, each atomically, exactly as if they had been calls of
// their own (check.lua). The reply is split between the callers.
//
// On a Cluster a script call cannot span hash slots, and every counter is a
// slot of its own, so a Check is a group per slot, and the leader sends one
// call per hash slot among the queued groups, all in one pipeline
// (sendPipelined): go-redis writes each node its calls at once and reads
// their replies together, in parallel across the nodes, following MOVED and
// ASK. Groups of the same slot share a call, as on a single node; each node
// pays one network read and write per pipeline instead of per call, and
// envoy-rls one system call each way per node and no goroutine per slot. The
// caller then decodes its calls and, when one slot vetoed or failed, refunds
// the others as checkCluster does. Everything below applies to both, but for
// the connection of a slot: Cluster pipelines use the pool of each node.
//
// There is no sender goroutine: a Check that finds a slot idle sends its
// call itself, so a lone Check crosses no goroutine on its way to Redis and
// back. Groups queue only while every slot is in a call; a leader whose call
// has ended lends its slot to the oldest queued Check, whose caller wakes to
// send the next call (the wake-up it needed anyway for its result), or puts
// it back. A busier server sends bigger calls, not more of them: Redis then
// pays one command, one TIME and one network read and write per call instead
// of per Check, and envoy-rls one system call each way.
//
// A slot keeps its connection (a single node's or Sentinel's master;
// redis.Client.Conn) rather than taking one from the pool per call, which
// spares go-redis's health check of a pooled connection (a system call) and
// the pool's bookkeeping; after any failed call it drops the connection and
// takes a fresh one for the next call, so that a broken connection or a
// demoted master is left behind.
//
// Spare slots: every slot but the first is a spare, which starts a call
// only when each call in flight has taken at least Options.SpareAfter (or no
// call is in flight). While Redis answers quickly one call is in flight at a
// time, and it carries every Check that arrived meanwhile: Redis pays its
// per-call costs and envoy-rls its system calls for fewer calls. When a call
// stalls (a lost packet waits 200 ms or more for TCP to resend it), the Checks
// behind it wait no longer than SpareAfter before a spare carries them; a
// timer (the coalescer's spare) lends a spare to the oldest queued Check then.
// A slot whose call ends goes back idle rather than lead the next call while
// another slot's call is younger than SpareAfter, so that the calls fall back
// to one at a time once Redis is quick again. A SpareAfter of zero (the
// default) makes every slot start a call at once, as many at a time as there
// are slots: one call at a time carries more Checks and spares Redis CPU, but
// a Check that arrives during a call waits for its end, which lengthens the
// tail at a moderate rate (measured in docs/performance.md, "Coalescing:
// slots and spares").
//
// Deadlines: a Check's deadline is the soonest of its context's,
// Options.Timeout from its start and the one CheckBy was given, and a call is
// bounded by the earliest deadline of its groups, so that nobody waits past
// their own, and carries only groups whose deadlines are not much earlier or
// later than its leader's (mayJoin), so that nobody is failed by a much
// shorter deadline than their own; no context is derived per Check. A Check still queued at its
// deadline is answered then by a timer of the coalescer's (expireQueued),
// armed for the earliest deadline in the queue, and nothing of it is sent.
// A caller whose context ends while its group is queued takes it back
// (nothing is sent); while its group is in a call, it stops waiting and
// reports limiter.ErrUnavailable, and its group may still be decided (and
// counted) by that call, as with a reply lost on the network; on a Cluster
// the leader then settles it as its caller would have (settleAbandoned:
// when one of its slots vetoed or failed, the others are refunded). A group whose
// deadline has passed before its call is built is not sent. A caller lent a
// slot after its context ended or its deadline passed passes the slot on
// instead of leading. A leader waits for its own call even when its context
// is canceled meanwhile: the call is bounded by the leader's deadline like
// any other. (A leader whose context ends in the microseconds between
// taking the lead and building the call is left out of the call it still
// sends for the others, and waits for it until their earliest deadline.)
//
// Shared fate: a call that fails (its earliest deadline passes, the
// connection breaks, Redis refuses the script for being out of memory)
// fails every Check it carried with limiter.ErrUnavailable, and each is
// answered by its rule's failure mode; groups the script decided before the
// error keep what they counted, as with a lost reply. Never an
// over-admission: at worst hits counted for callers who were told the store
// failed. (A Cluster call refused with TRYAGAIN, which did not run, is sent
// again first: see "Resending after TRYAGAIN" in cluster.go.)

// Defaults of the coalescing options.
const (
	// DefaultSenders is the default number of coalesced calls in flight at
	// once (Options.Senders).
	DefaultSenders = 2
	// DefaultMaxBatch is the default bound on the requests of one
	// coalesced call (Options.MaxBatch).
	DefaultMaxBatch = 256
)

// Job states. A job is owned by its caller until a leader takes it into a
// call; from then on whichever of the caller and the leader finishes with it
// last puts it back in the pool: the caller after reading a result, the
// leader after delivering one that nobody waits for any more.
const (
	jobPending   int32 = iota // queued or in a call, no result yet
	jobDone                   // result delivered; the caller owns the job
	jobAbandoned              // the caller stopped waiting; the leader owns it
)

// job is one Check waiting for a coalesced call.
type job struct {
	// The Check's calls and their groups (groups[i] encodes the requests
	// of calls[i]): on a single node or Sentinel one, of every request
	// (one, kept with the job); on a Cluster one per hash slot.
	calls     []*slotCall
	groups    []group
	one       slotCall
	slotCalls []slotCall // on a Cluster, the calls' structs, kept for the next Check
	ctx       context.Context
	deadline  time.Time // zero: none
	// kept is a copy of the Check's requests, made by a caller that stops
	// waiting while its Cluster Check of several slot calls is in a call,
	// for the leader to settle it (settleAbandoned).
	kept  []limiter.Request
	state atomic.Int32
	// done receives once per delivered result, and once when the job's
	// caller is lent a slot to lead the next call.
	done chan struct{}
	err  error // the Check failed before its calls were decided
	// Under coalescer.mu: queued while the job is in coalescer.queue; lead
	// is the slot lent to its caller (taking the job out of the queue),
	// until the caller takes it.
	queued bool
	lead   *batch
}

// coalescer queues Checks and lends its sender slots to their callers.
type coalescer struct {
	b *Backend
	// conns gives slots their own connections; nil (a client that is not a
	// *redis.Client) means calls use the client's pool.
	conns    *redis.Client
	maxBatch int
	// spareAfter is how long the calls in flight must have taken before
	// another slot starts one (0: at once).
	spareAfter time.Duration
	pool       sync.Pool // *job
	// spares counts the calls started while another slot's call was in
	// flight.
	spares atomic.Uint64

	mu     sync.Mutex
	queue  []*job   // waiting for a call, oldest first
	idle   []*batch // slots not lent out
	slots  []*batch // every slot; with a spareAfter, a lent one has its start set
	closed bool
	// spare lends an idle slot to the oldest queued job once the calls in
	// flight have taken spareAfter (see spareAt); armed while it is set
	// to fire.
	spare      *time.Timer
	spareArmed bool
	// expire answers the queued jobs whose deadline has passed; set to
	// fire at expireAt, the earliest deadline of a job queued since it
	// last fired (zero while it is not set).
	expire   *time.Timer
	expireAt time.Time
	// lent counts the slots out of idle (in a call, or lent to a caller
	// who has not woken yet); close waits for them to come back.
	lent sync.WaitGroup
}

func newCoalescer(b *Backend, senders, maxBatch int, spareAfter time.Duration) *coalescer {
	conns, _ := b.client.(*redis.Client)
	c := &coalescer{b: b, conns: conns, maxBatch: maxBatch, spareAfter: spareAfter}
	c.pool.New = func() any { return &job{done: make(chan struct{}, 1)} }
	for range senders {
		c.idle = append(c.idle, new(batch))
	}
	c.slots = slices.Clone(c.idle)
	c.spare = time.AfterFunc(time.Hour, c.lendSpare)
	c.spare.Stop()
	c.expire = time.AfterFunc(time.Hour, c.expireQueued)
	c.expire.Stop()
	return c
}

// close makes every later check fail, fails the queued ones, and waits for
// the calls in flight to end for at most grace (a negative grace waits as
// long as it takes); it reports whether they have. It may be called again.
func (c *coalescer) close(grace time.Duration) bool {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		c.spare.Stop()
		c.expire.Stop()
		for _, bt := range c.idle {
			bt.closeConn()
		}
		c.idle = nil
		// A job lent a slot learns of the close when it leads.
		for _, j := range c.queue {
			j.queued = false
			c.deliver(j, errClosed)
		}
		c.dequeue(len(c.queue))
	}
	c.mu.Unlock()
	if grace < 0 {
		c.lent.Wait()
		return true
	}
	done := make(chan struct{})
	go func() { // ends with the calls in flight
		c.lent.Wait()
		close(done)
	}()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

var errClosed = errors.New("redisbackend: closed")

// check decides reqs as one group of a coalesced call that ends by deadline
// (zero: no deadline).
func (c *coalescer) check(ctx context.Context, deadline time.Time, reqs []limiter.Request, results []limiter.Result) error {
	j := c.pool.Get().(*job)
	j.encode(c.b, reqs)
	j.ctx, j.deadline = ctx, deadline
	j.state.Store(jobPending)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.put(j)
		return fmt.Errorf("%w: %w", limiter.ErrUnavailable, errClosed)
	}
	now := c.clock()
	switch bt := c.takeIdle(now); {
	case bt != nil && len(c.queue) == 0:
		c.lead(bt, j)
	case bt != nil:
		// A spare opens for Checks that queued behind a stalled call: it
		// goes to the oldest, and j queues behind them.
		j.queued = true
		c.queue = append(c.queue, j)
		c.armExpiry(deadline)
		c.lendHead(bt, now)
		c.mu.Unlock()
	default:
		j.queued = true
		c.queue = append(c.queue, j)
		c.armExpiry(deadline)
		c.armSpare(now)
		c.mu.Unlock()
	}
	for {
		select {
		case <-j.done:
		case <-ctx.Done():
			if c.withdraw(j) || j.abandon(reqs) {
				return unavailable(ctx, "check script", ctx.Err())
			}
			<-j.done // delivered meanwhile
		}
		// j.lead was set before the signal was sent, and nobody else
		// writes it while j is out of the queue.
		bt := j.lead
		if bt == nil {
			break
		}
		// Lent a slot: lead the next call, j first.
		j.lead = nil
		if err := c.takeLead(bt, j); err != nil {
			return unavailable(ctx, "check script", err)
		}
	}
	defer c.put(j)
	if err := j.err; err != nil {
		return callFailed(ctx, deadline, err)
	}
	return c.b.finish(ctx, deadline, reqs, j.calls, results)
}

// abandon hands j to the leader of the call that carries it, for its
// caller, whose context has ended, to return at once; it reports whether
// it did (false: j was delivered meanwhile). A Cluster Check of several
// slot calls leaves a copy of its requests, so that the leader can refund
// what its slots consumed if one of them failed or vetoed.
func (j *job) abandon(reqs []limiter.Request) bool {
	if len(j.calls) > 1 {
		j.kept = append(j.kept[:0], reqs...)
	}
	return j.state.CompareAndSwap(jobPending, jobAbandoned)
}

// callFailed wraps err, the failure of a Check's coalesced call, in
// limiter.ErrUnavailable, adding context.DeadlineExceeded once the Check's
// deadline has passed (the socket's deadline can fire just before it, and
// go-redis reports that as an i/o timeout).
func callFailed(ctx context.Context, deadline time.Time, err error) error {
	if !deadline.IsZero() && !time.Now().Before(deadline) && !errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w (%w)", err, context.DeadlineExceeded)
	}
	return unavailable(ctx, "check script", err)
}

// encode fills j with the calls and groups of the Check of reqs: on a
// Cluster, split by hash slot, the groups asking for the figures without
// consumption when there are several (a slot may have to be refunded).
func (j *job) encode(b *Backend, reqs []limiter.Request) {
	if b.cluster == nil {
		j.calls = append(j.calls[:0], &j.one) // zero: put cleared it
		if len(j.groups) == 0 {
			j.groups = make([]group, 1)
		}
		j.groups = j.groups[:1]
		j.groups[0].encode(b, reqs, nil)
		return
	}
	j.calls = b.appendSlotCalls(j.calls[:0], &j.slotCalls, reqs)
	if cap(j.groups) < len(j.calls) {
		j.groups = append(j.groups[:cap(j.groups)], make([]group, len(j.calls)-cap(j.groups))...)
	}
	j.groups = j.groups[:len(j.calls)]
	for i, call := range j.calls {
		j.groups[i].encode(b, reqs, call.idx)
		switch n := len(call.idx); {
		case len(j.calls) == 1:
			call.alt = nil // no figures without consumption: nothing to refund
		case cap(call.alt) >= n:
			call.alt = call.alt[:n] // decodeReply writes every one
		default:
			call.alt = make([]figures, n)
		}
	}
}

// nkeys returns the number of requests (keys) of j's Check.
func (j *job) nkeys() int {
	n := 0
	for i := range j.groups {
		n += len(j.groups[i].keys)
	}
	return n
}

// finish decodes the replies of a coalesced Check's calls into results and,
// on a Cluster, settles it as checkCluster does.
func (b *Backend) finish(ctx context.Context, deadline time.Time, reqs []limiter.Request, calls []*slotCall, results []limiter.Result) error {
	for _, call := range calls {
		if call.err != nil {
			call.err = callFailed(ctx, deadline, call.err)
			continue
		}
		call.now, call.committed, call.err = decodeReply(call.reply, reqs, call.idx, results, call.alt)
		if call.err != nil {
			call.err = unavailable(ctx, "check script", call.err)
		}
	}
	var err error
	if len(calls) == 1 {
		err = calls[0].err
	} else {
		// The caller waits for the refunds, if any, until its deadline, as
		// in checkCluster; they run on to their own bound (settle).
		rctx, cancel := boundBy(ctx, deadline)
		err = b.settle(rctx, reqs, calls, results)
		cancel()
	}
	if err != nil && b.cluster != nil {
		// As in Check: refresh the slot map now.
		b.cluster.ReloadState(ctx)
	}
	return err
}

// takeLead has j's caller, lent slot bt, lead the next call, unless its
// context has ended or its deadline has passed meanwhile (a slot can be lent
// to a queued job an instant after its deadline, before the expiry timer
// answers it): then bt goes on to the next queued job, so that the caller
// does not wait for a call of others' Checks past its own deadline, and j
// goes back to the pool. It returns nil if the caller led, else why not.
func (c *coalescer) takeLead(bt *batch, j *job) error {
	c.mu.Lock()
	if err := j.ended(time.Now()); err != nil {
		c.pass(bt, c.clock())
		c.mu.Unlock()
		c.put(j)
		return err
	}
	c.lead(bt, j)
	return nil
}

// withdraw takes j back for its caller, whose context has ended, if no call
// has taken it: from the queue, or with the slot it was lent, which goes to
// the next queued job. It reports whether the caller owns j again (and put
// it back in the pool).
func (c *coalescer) withdraw(j *job) bool {
	c.mu.Lock()
	if bt := j.lead; bt != nil {
		j.lead = nil
		<-j.done // the loan's signal, sent under mu
		c.pass(bt, c.clock())
	} else if j.queued {
		c.queue = slices.DeleteFunc(c.queue, func(q *job) bool { return q == j })
		j.queued = false
	} else {
		c.mu.Unlock()
		return false
	}
	c.mu.Unlock()
	c.put(j)
	return true
}

// lead sends one call with slot bt for first, its caller's job, and the
// oldest queued jobs, up to maxBatch requests (first goes even when it alone
// exceeds them); then it passes bt on. It is called with c.mu held and
// returns without it.
func (c *coalescer) lead(bt *batch, first *job) {
	if c.closed {
		bt.closeConn()
		c.lent.Done()
		c.mu.Unlock()
		c.deliver(first, errClosed)
		return
	}
	jobs := append(bt.jobs[:0], first)
	n := first.nkeys()
	var now time.Time // for mayJoin, read only when a Check is queued
	if len(c.queue) > 0 {
		now = time.Now()
	}
	kept := 0 // the queued jobs left for a later call, moved to the front
	for i, q := range c.queue {
		k := q.nkeys()
		if n+k > c.maxBatch {
			kept += copy(c.queue[kept:], c.queue[i:])
			break
		}
		if !mayJoin(first, q, now) {
			c.queue[kept] = q
			kept++
			continue
		}
		q.queued = false
		jobs = append(jobs, q)
		n += k
	}
	clear(c.queue[kept:])
	c.queue = c.queue[:kept]
	if kept > 0 {
		// Jobs that may not join were left queued: an idle slot, if one
		// may start a call, goes to the oldest of them.
		at := c.clock()
		if idle := c.takeIdle(at); idle != nil {
			c.lendHead(idle, at)
		}
	}
	c.mu.Unlock()
	bt.jobs = jobs
	c.send(bt, jobs)
	clear(bt.jobs)
	at := c.clock()
	c.mu.Lock()
	c.pass(bt, at)
	c.mu.Unlock()
}

// deadlineSlack is how much earlier than its leader's a deadline in a
// coalesced call may be (see mayJoin).
const deadlineSlack = time.Millisecond

// mayJoin reports whether the Check of queued job q may share the call that
// the Check of job first leads from now. Neither has a deadline; or q's is
// no more than deadlineSlack earlier than first's, and no later than
// first's by more than the time first has left (R, at least
// deadlineSlack). A call is bounded by the earliest deadline of its Checks,
// so that nobody waits past their own; so the call ends no earlier than
// deadlineSlack before its leader's deadline, and it fails a Check with
// time left only when Redis took longer than R − deadlineSlack, while that
// Check had at most R + max(deadlineSlack, R) left: a Check is failed by a
// call-mate's deadline only when Redis took about half the time it had
// itself or more (48% of it when the leader has 20 ms left, 25% when 2 ms,
// the least it could be). Checks of one budget (a
// gateway's timeout) share calls as long as the leader, the oldest, has
// more time left than the queue is long (about a call's round trip while
// Redis keeps up), so that the calls carry every Check that arrived during
// the one before and keep up with a slow Redis; a leader that spent most
// of its time in the queue, when Redis is slower than that, carries only
// the Checks about as close to their deadlines as it is. A Check of another
// timeout (a gateway with a longer or shorter one), or one that arrived
// well after a stale leader, waits for a call of its own.
func mayJoin(first, q *job, now time.Time) bool {
	if first.deadline.IsZero() || q.deadline.IsZero() {
		return first.deadline.IsZero() == q.deadline.IsZero()
	}
	d := q.deadline.Sub(first.deadline)
	return d >= -deadlineSlack && d <= max(deadlineSlack, first.deadline.Sub(now))
}

// pass lends slot bt, out of the idle ones, to the oldest queued job, whose
// caller wakes to lead the next call, unless another slot's call is younger
// than spareAfter at now: then, or when nothing is queued, bt goes back
// among the idle ones. It is called with c.mu held.
func (c *coalescer) pass(bt *batch, now time.Time) {
	bt.start = time.Time{}
	switch {
	case c.closed:
		bt.closeConn()
		c.lent.Done()
	case len(c.queue) > 0 && !now.Before(c.spareAt()):
		c.start(bt, now)
		c.lendHead(bt, now)
	default:
		c.idle = append(c.idle, bt)
		c.lent.Done()
		c.armSpare(now)
	}
}

// lendHead lends slot bt, lent out at now, to the oldest queued job, whose
// caller wakes to lead the next call. The jobs still queued (more than one
// call carries, or that arrived meanwhile) get the spare timer in turn, so
// that they too wait no longer than spareAfter for a slot while one is idle.
// It is called with c.mu held.
func (c *coalescer) lendHead(bt *batch, now time.Time) {
	q := c.queue[0]
	c.dequeue(1)
	q.queued = false
	q.lead = bt
	q.done <- struct{}{}
	c.armSpare(now)
}

// spareAt returns the instant from which another slot may start a call:
// when the youngest call in flight will have taken spareAfter (zero when no
// slot is lent or spareAfter is 0). It is called with c.mu held.
func (c *coalescer) spareAt() time.Time {
	var at time.Time
	if c.spareAfter == 0 {
		return at
	}
	for _, bt := range c.slots {
		if !bt.start.IsZero() && bt.start.After(at) {
			at = bt.start
		}
	}
	if at.IsZero() {
		return at
	}
	return at.Add(c.spareAfter)
}

// start marks slot bt, out of the idle ones, lent at now, counting a spare
// call when another slot is lent too. It is called with c.mu held.
func (c *coalescer) start(bt *batch, now time.Time) {
	if len(c.slots)-len(c.idle) > 1 {
		c.spares.Add(1)
	}
	bt.start = now
}

// clock returns the time for the spare slots' bookkeeping: the zero time
// when spareAfter is 0, which needs none (every slot may start a call at
// any time), so that the default costs no clock reading per Check.
func (c *coalescer) clock() time.Time {
	if c.spareAfter == 0 {
		return time.Time{}
	}
	return time.Now()
}

// takeIdle takes an idle slot out, lent at now, if one may start a call at
// now (see spareAt), or returns nil. It is called with c.mu held.
func (c *coalescer) takeIdle(now time.Time) *batch {
	n := len(c.idle)
	if n == 0 || now.Before(c.spareAt()) {
		return nil
	}
	bt := c.idle[n-1]
	c.idle = c.idle[:n-1]
	c.lent.Add(1)
	c.start(bt, now)
	return bt
}

// armSpare sets the spare timer to fire when another slot may start a call,
// if jobs are queued and a slot is idle. It is called with c.mu held.
func (c *coalescer) armSpare(now time.Time) {
	if c.spareArmed || c.closed || len(c.queue) == 0 || len(c.idle) == 0 {
		return
	}
	c.spareArmed = true
	c.spare.Reset(c.spareAt().Sub(now))
}

// lendSpare, the spare timer's function, lends an idle slot to the oldest
// queued job if the calls in flight have taken spareAfter, or sets the timer
// again for when they will have.
func (c *coalescer) lendSpare() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.spareArmed = false
	now := time.Now()
	if len(c.queue) == 0 {
		return
	}
	if bt := c.takeIdle(now); bt != nil {
		c.lendHead(bt, now)
		return
	}
	c.armSpare(now)
}

// armExpiry sets the expiry timer to fire at deadline (zero: none), the
// deadline of a job just queued, unless it is set to fire by then. It is
// called with c.mu held.
func (c *coalescer) armExpiry(deadline time.Time) {
	if deadline.IsZero() || c.closed || !c.expireAt.IsZero() && !deadline.Before(c.expireAt) {
		return
	}
	c.expireAt = deadline
	c.expire.Reset(time.Until(deadline))
}

// expireQueued, the expiry timer's function, answers the queued jobs whose
// deadline has passed with context.DeadlineExceeded (nothing of theirs was
// sent) and sets the timer again for the earliest deadline of the others.
// This, not a context derived per Check, is what ends the wait of a Check
// queued behind calls that take longer than its deadline; a Check in a call
// needs nothing of the kind, since the call ends by the earliest deadline
// of its groups.
func (c *coalescer) expireQueued() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expireAt = time.Time{}
	now := time.Now()
	var next time.Time
	c.queue = slices.DeleteFunc(c.queue, func(j *job) bool {
		switch {
		case j.deadline.IsZero():
			return false
		case now.Before(j.deadline):
			next = earliest(next, j.deadline)
			return false
		}
		j.queued = false
		c.deliver(j, context.DeadlineExceeded)
		return true
	})
	c.armExpiry(next)
}

// dequeue drops the n oldest jobs of the queue. It is called with c.mu
// held.
func (c *coalescer) dequeue(n int) {
	rest := copy(c.queue, c.queue[n:])
	clear(c.queue[rest:])
	c.queue = c.queue[:rest]
}

// put returns j to the pool, without references to its caller's data.
func (c *coalescer) put(j *job) {
	for i := range j.groups {
		j.groups[i].release()
	}
	clear(j.calls)
	j.calls = j.calls[:0]
	for i := range j.slotCalls {
		j.slotCalls[i].err, j.slotCalls[i].reply = nil, ""
	}
	j.one = slotCall{}
	clear(j.kept)
	j.ctx, j.err, j.deadline, j.kept = nil, nil, time.Time{}, j.kept[:0]
	c.pool.Put(j)
}

// deliver hands j's result to its caller, or, if the caller gave up,
// settles a Cluster Check of several slot calls that were sent (its
// refunds, if any, run in the Backend's goroutines) and releases j.
func (c *coalescer) deliver(j *job, err error) {
	j.err = err
	if j.state.CompareAndSwap(jobPending, jobDone) {
		j.done <- struct{}{}
		return
	}
	if err == nil && len(j.calls) > 1 {
		c.b.settleAbandoned(j.kept, j.calls)
	}
	c.put(j)
}

// ended returns why j's caller no longer waits at now: its context's error,
// or DeadlineExceeded once its deadline has passed; nil while it waits.
func (j *job) ended(now time.Time) error {
	if err := j.ctx.Err(); err != nil {
		return err
	}
	if !j.deadline.IsZero() && !now.Before(j.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// send makes one call for the groups of jobs and delivers every result.
func (c *coalescer) send(bt *batch, jobs []*job) {
	// Drop the groups whose caller has given up or whose deadline has
	// passed, and bound the call by the earliest deadline of the others.
	live := jobs[:0]
	var deadline time.Time
	now := time.Now()
	for _, j := range jobs {
		if err := j.ended(now); err != nil {
			c.deliver(j, err)
			continue
		}
		deadline = earliest(deadline, j.deadline)
		live = append(live, j)
	}
	if len(live) == 0 {
		return
	}
	ctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	if c.b.cluster != nil {
		c.sendPipelined(ctx, bt, live)
		return
	}
	keys, argv, parts := bt.keys[:0], bt.argv[:0], bt.parts[:0]
	for _, j := range live {
		g := &j.groups[0]
		keys = append(keys, g.keys...)
		argv = append(argv, g.argv...)
		parts = append(parts, part{j.calls[0], len(g.keys)})
	}
	bt.keys, bt.argv = keys, argv
	if bt.conn == nil && c.conns != nil {
		bt.conn = c.conns.Conn()
	}
	c.b.calls.Add(1)
	cmd := c.b.runCheck(ctx, bt, keys, argv, c.b.flags[0])
	v, err := cmd.Result()
	if err != nil {
		bt.closeConn()
	}
	clear(keys)
	clear(argv)
	clear(bt.cmd)
	splitReply(v, err, false, parts)
	clear(parts)
	bt.parts = parts[:0]
	for _, j := range live {
		c.deliver(j, nil)
	}
}

// part is one group of a call: the slotCall it decides and its number of
// requests.
type part struct {
	call *slotCall
	n    int
}

// splitReply hands each part its share of v, the reply of the call that
// decided their groups in order (with the figures without consumption when
// alt), or the call's error when it failed or its reply does not hold its
// groups exactly.
func splitReply(v string, err error, alt bool, parts []part) {
	if err == nil {
		rest := v
		for i, pt := range parts {
			k, ok := groupReplyLen(rest, pt.n, alt)
			if !ok {
				err = fmt.Errorf("reply of %d bytes ends within group %d of %d", len(v), i+1, len(parts))
				break
			}
			pt.call.reply, rest = rest[:k], rest[k:]
		}
		if err == nil && rest != "" {
			err = fmt.Errorf("reply of %d bytes holds %d bytes after its %d groups", len(v), len(rest), len(parts))
		}
	}
	if err != nil {
		for _, pt := range parts {
			pt.call.reply, pt.call.err = "", err
		}
	}
}

// sendPipelined makes the calls of the Cluster jobs live in one pipeline:
// go-redis sends each node its calls together and reads their replies
// together, in parallel across the nodes, following MOVED and ASK; the
// calls refused with TRYAGAIN go again in another pipeline. The
// groups of one hash slot (with the same flags) go in one call, in queue
// order, as on a single node: Redis decides them one after the other, each
// atomically, and reads and writes a counter they share once. It delivers
// every job; each of its calls holds its reply or error.
func (c *coalescer) sendPipelined(ctx context.Context, bt *batch, live []*job) {
	b := c.b
	var verb, script any = "evalsha", b.scripts.checkSHA
	if b.functions.Load() {
		verb, script = "fcall", b.scripts.checkFn
	}
	// The calls, kept with the slot with their slices for the next
	// pipeline, and indexed by slot·2 + alt.
	if bt.pipeBy == nil {
		bt.pipeBy = make(map[int]int)
	}
	cmds := bt.pipe[:0]
	for _, j := range live {
		alt := len(j.calls) > 1
		for i, call := range j.calls {
			g := &j.groups[i]
			by := call.slot*2 + btoi(alt)
			k, ok := bt.pipeBy[by]
			if !ok {
				k = len(cmds)
				bt.pipeBy[by] = k
				if k < cap(cmds) {
					cmds = cmds[:k+1]
				} else {
					cmds = append(cmds, pipeCall{})
				}
				cmds[k].alt = alt
			}
			pc := &cmds[k]
			pc.parts = append(pc.parts, part{call, len(g.keys)})
			pc.keys = append(pc.keys, g.keys...)
			pc.argv = append(pc.argv, g.argv...)
		}
	}
	bt.pipe = cmds
	for k := range cmds {
		pc := &cmds[k]
		pc.args = appendCheckArgs(pc.args[:0], verb, script, pc.keys, pc.argv, b.flags[btoi(pc.alt)])
	}
	b.pipeline(ctx, cmds, false)
	b.calls.Add(uint64(len(cmds)))
	// finish splits the reply of call pc between its groups and releases
	// it (pc.cmd nil: finished).
	finish := func(pc *pipeCall) {
		v, err := pc.cmd.Result()
		if isFunctionMissing(err) || isUnsupported(err) || isNoScript(err) {
			// Refused before it ran: send it alone, through runCheck,
			// which loads the library or falls back to scripts.
			sb := b.scratch.Get().(*batch)
			v, err = b.runCheck(ctx, sb, pc.keys, pc.argv, b.flags[btoi(pc.alt)]).Result()
			clear(sb.cmd)
			b.scratch.Put(sb)
		}
		splitReply(v, err, pc.alt, pc.parts)
		pc.release()
	}
	// The calls refused with TRYAGAIN did not run: they go again, together,
	// after a wait (see "Resending after TRYAGAIN" in cluster.go); the
	// others are finished at once, and after the first round the jobs none
	// of whose calls waits for a resend are answered, rather than wait for
	// a call-mate's migrating slot.
	for n := 0; ; n++ {
		again := 0
		for k := range cmds {
			pc := &cmds[k]
			if pc.cmd == nil {
				continue
			}
			if isTryAgain(pc.cmd.Err()) {
				again++
			} else {
				finish(pc)
			}
		}
		if again > 0 && n == 0 {
			live = c.deliverDecided(live)
		}
		if again == 0 || !b.tryAgainWait(ctx, n) {
			break
		}
		b.tryAgains.Add(uint64(again))
		b.pipeline(ctx, cmds, true)
	}
	for k := range cmds {
		if cmds[k].cmd != nil {
			finish(&cmds[k])
		}
	}
	clear(bt.pipeBy)
	for _, j := range live {
		c.deliver(j, nil)
	}
}

// deliverDecided delivers the jobs every call of which has its reply or its
// error, and returns the others (those with a call waiting for a resend
// after TRYAGAIN), reusing live's array.
func (c *coalescer) deliverDecided(live []*job) []*job {
	kept := live[:0]
	for _, j := range live {
		if slices.ContainsFunc(j.calls, func(call *slotCall) bool { return call.err == nil && call.reply == "" }) {
			kept = append(kept, j) // a reply is never empty
			continue
		}
		c.deliver(j, nil)
	}
	return kept
}

// pipeline sends the calls cmds, whose arguments are built, in one Cluster
// pipeline, each as a new noRetry command; with again, only those not
// finished (pc.cmd set), which sendPipelined leaves so only when Redis
// refused them with TRYAGAIN.
func (b *Backend) pipeline(ctx context.Context, cmds []pipeCall, again bool) {
	_, _ = b.cluster.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k := range cmds {
			pc := &cmds[k]
			if again && pc.cmd == nil {
				continue
			}
			pc.cmd = redis.NewStringCmd(ctx, pc.args...)
			pc.cmd.SetFirstKeyPos(3)
			_ = p.Process(ctx, noRetry{pc.cmd})
		}
		return nil
	})
}

// pipeCall is one call of a Cluster pipeline (sendPipelined): the groups of
// one hash slot with the same flags, and the command that carries them. A
// sender slot keeps its pipeCalls, and their slices, from one pipeline to
// the next.
type pipeCall struct {
	alt        bool
	parts      []part
	keys, argv []string
	args       []any // the command's arguments: pointers into keys and argv
	cmd        *redis.StringCmd
}

// release drops pc's references to the pipeline's jobs and command,
// keeping its slices' capacity.
func (pc *pipeCall) release() {
	clear(pc.parts)
	clear(pc.keys)
	clear(pc.argv)
	clear(pc.args)
	pc.parts, pc.keys, pc.argv, pc.args = pc.parts[:0], pc.keys[:0], pc.argv[:0], pc.args[:0]
	pc.cmd = nil
}

// btoi is 1 for true, 0 for false.
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
