package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/redis/go-redis/v9"
)

// Coalescing
//
// On a single node or Sentinel, concurrent Checks are sent together: a Check
// encodes its group (keys and specs) in its own goroutine and hands it to one
// of a few sender goroutines; a sender takes every group that is waiting, up
// to MaxBatch requests, and sends them as one check call, in which Redis
// decides the groups one after the other, each atomically, exactly as if
// they had been calls of their own (check.lua). The reply is split between
// the callers.
//
// A sender keeps one connection of its own (a single node's or Sentinel's
// master; redis.Client.Conn) rather than taking one from the pool per call,
// which spares go-redis's health check of a pooled connection (a system
// call) and the pool's bookkeeping; after any failed call it drops the
// connection and takes a fresh one for the next call, so that a broken
// connection or a demoted master is left behind.
//
// A sender sends the moment it has a group, so a lone Check is not delayed:
// groups pile up only while every sender has a call in flight, and a busier
// server sends bigger calls, not more of them. Redis then pays one command,
// one TIME and one network read and write per call instead of per Check, and
// envoy-rls one system call each way.
//
// Deadlines: a Check's deadline is its context's or Options.Timeout from
// its start, whichever is sooner, and a call is bounded by the earliest
// deadline of its groups, so that nobody waits past their own; no context is
// derived per Check. A caller whose context ends first stops waiting and
// reports limiter.ErrUnavailable; its group may still be decided (and
// counted) by a call already sent, as with a reply lost on the network. A
// group whose deadline has passed before its call is built is not sent.
//
// Shared fate: a call that fails (its earliest deadline passes, the
// connection breaks, or the script errs on one group, e.g. WRONGTYPE on a
// key another program wrote) fails every Check it carried with
// limiter.ErrUnavailable, and each is answered by its rule's failure mode;
// groups the script decided before the error keep what they counted, as
// with a lost reply. Never an over-admission: at worst hits counted for
// callers who were told the store failed.

// Defaults of the coalescing options.
const (
	// DefaultSenders is the default number of coalesced calls in flight at
	// once (Options.Senders).
	DefaultSenders = 2
	// DefaultMaxBatch is the default bound on the requests of one
	// coalesced call (Options.MaxBatch).
	DefaultMaxBatch = 256
)

// Job states. A job is owned by its caller until it is handed to a sender;
// from then on whichever of the caller and the sender finishes with it last
// puts it back in the pool: the caller after reading a result, the sender
// after delivering one that nobody waits for any more.
const (
	jobPending   int32 = iota // handed to a sender, no result yet
	jobDone                   // result delivered; the caller owns the job
	jobAbandoned              // the caller stopped waiting; the sender owns it
)

// job is one Check waiting for a coalesced call.
type job struct {
	g        group
	ctx      context.Context
	deadline time.Time // zero: none
	state    atomic.Int32
	done     chan struct{} // receives once per delivered result
	reply    string        // the group's part of the reply
	err      error
}

// coalescer owns the sender goroutines of a Backend.
type coalescer struct {
	b *Backend
	// conns gives senders their own connections; nil (a client that is
	// not a *redis.Client) means they use the client's pool.
	conns    *redis.Client
	jobs     chan *job // unbuffered: a job is only ever held by a caller or a sender
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
	maxBatch int
	pool     sync.Pool // *job
}

func newCoalescer(b *Backend, senders, maxBatch int) *coalescer {
	conns, _ := b.client.(*redis.Client)
	c := &coalescer{
		b:        b,
		conns:    conns,
		jobs:     make(chan *job),
		stop:     make(chan struct{}),
		maxBatch: maxBatch,
	}
	c.pool.New = func() any { return &job{done: make(chan struct{}, 1)} }
	for range senders {
		c.wg.Go(c.sender)
	}
	return c
}

// close makes every later check fail and stops the senders after their
// calls in flight end. It waits for them for at most grace (a negative grace
// waits as long as it takes) and reports whether they have stopped. It may
// be called again.
func (c *coalescer) close(grace time.Duration) bool {
	c.stopOnce.Do(func() { close(c.stop) })
	if grace < 0 {
		c.wg.Wait()
		return true
	}
	done := make(chan struct{})
	go func() { // ends with the senders
		c.wg.Wait()
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
	j.g.encode(c.b, reqs, nil)
	j.ctx, j.deadline = ctx, deadline
	j.state.Store(jobPending)
	select {
	case c.jobs <- j:
	case <-ctx.Done():
		c.put(j)
		return unavailable(ctx, "check script", ctx.Err())
	case <-c.stop:
		c.put(j)
		return fmt.Errorf("%w: %w", limiter.ErrUnavailable, errClosed)
	}
	select {
	case <-j.done:
	case <-ctx.Done():
		if j.state.CompareAndSwap(jobPending, jobAbandoned) {
			return unavailable(ctx, "check script", ctx.Err())
		}
		<-j.done // delivered meanwhile
	}
	defer c.put(j)
	if err := j.err; err != nil {
		if !deadline.IsZero() && !time.Now().Before(deadline) && !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (%w)", err, context.DeadlineExceeded)
		}
		return unavailable(ctx, "check script", err)
	}
	if _, _, err := decodeReply(j.reply, nil, results, nil); err != nil {
		return unavailable(ctx, "check script", err)
	}
	return nil
}

// put returns j to the pool, without references to its caller's data.
func (c *coalescer) put(j *job) {
	j.g.release()
	j.ctx, j.err, j.deadline = nil, nil, time.Time{}
	j.reply = ""
	c.pool.Put(j)
}

// deliver hands j's result to its caller, or releases j if the caller gave
// up.
func (c *coalescer) deliver(j *job, err error) {
	j.err = err
	if j.state.CompareAndSwap(jobPending, jobDone) {
		j.done <- struct{}{}
		return
	}
	c.put(j)
}

// sender sends coalesced calls until the coalescer stops.
func (c *coalescer) sender() {
	var queued []*job
	bt := new(batch)
	defer func() {
		if bt.conn != nil {
			_ = bt.conn.Close()
		}
	}()
	for {
		var j *job
		select {
		case j = <-c.jobs:
		case <-c.stop:
			return
		}
		queued = append(queued[:0], j)
		n := len(j.g.keys)
	fill:
		for n < c.maxBatch {
			select {
			case j := <-c.jobs:
				queued = append(queued, j)
				n += len(j.g.keys)
			default:
				break fill
			}
		}
		c.send(bt, queued)
		clear(queued)
	}
}

// send makes one call for the groups of jobs and delivers every result.
func (c *coalescer) send(bt *batch, jobs []*job) {
	// Drop the groups whose caller has given up or whose deadline has
	// passed, and bound the call by the earliest deadline of the others.
	live := jobs[:0]
	var deadline time.Time
	now := time.Now()
	for _, j := range jobs {
		if err := j.ctx.Err(); err != nil {
			c.deliver(j, err)
			continue
		}
		if !j.deadline.IsZero() {
			if !now.Before(j.deadline) {
				c.deliver(j, context.DeadlineExceeded)
				continue
			}
			if deadline.IsZero() || j.deadline.Before(deadline) {
				deadline = j.deadline
			}
		}
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
	keys, argv := bt.keys[:0], bt.argv[:0]
	want := 0
	for _, j := range live {
		keys = append(keys, j.g.keys...)
		argv = append(argv, j.g.argv...)
		want += replyLen(len(j.g.keys), false)
	}
	bt.keys, bt.argv = keys, argv
	if bt.conn == nil && c.conns != nil {
		bt.conn = c.conns.Conn()
	}
	c.b.calls.Add(1)
	cmd := c.b.runCheck(ctx, bt, keys, argv, c.b.flags[0])
	v, err := cmd.Result()
	if err != nil && bt.conn != nil {
		_ = bt.conn.Close()
		bt.conn = nil
	}
	clear(keys)
	clear(argv)
	clear(bt.cmd)
	if err == nil && len(v) != want {
		err = fmt.Errorf("reply has %d bytes, want %d", len(v), want)
	}
	for _, j := range live {
		if err != nil {
			c.deliver(j, err)
			continue
		}
		k := replyLen(len(j.g.keys), false)
		j.reply, v = v[:k], v[k:]
		c.deliver(j, nil)
	}
}
