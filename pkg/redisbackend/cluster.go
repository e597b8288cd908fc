package redisbackend

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/redis/go-redis/v9"
)

// slotCall is the part of a Cluster batch that lives in one hash slot.
type slotCall struct {
	slot      int   // the hash slot (set on a Cluster only)
	idx       []int // request indexes, in batch order
	alt       []figures
	now       int64
	committed bool
	err       error
	reply     string // a coalesced call's reply, decoded by its caller
}

// Resending after TRYAGAIN
//
// While a hash slot migrates from one master to another (resharding:
// CLUSTER SETSLOT IMPORTING and MIGRATING, then MIGRATE of the slot's keys,
// then CLUSTER SETSLOT NODE), a script call whose keys are split between the
// two nodes (two counters of one slot, one moved and the other not) is
// refused with TRYAGAIN, by the source, or by the target when go-redis
// followed an ASK redirection there. Redis refuses it before running
// anything, so sending it again cannot count twice; but go-redis resends no
// noRetry command, and the Check would fail for the milliseconds the slot's
// last keys take to move, its rules' failure modes deciding. envoy-rls resends
// such calls itself, checks and refunds, pipelined or not: only the calls
// refused with TRYAGAIN (never one that failed on the network or timed out),
// after tryAgainBackoff, doubling up to tryAgainMaxBackoff, at most
// Backend.tryAgainRetries times, and not when the wait would end at or past
// the call's deadline. A call still refused then fails as any other, with
// limiter.ErrUnavailable. CallStats.TryAgainRetries counts the resends.

// Resending after TRYAGAIN: the defaults.
const (
	// defaultTryAgainRetries bounds the resends of one call after TRYAGAIN
	// (Backend.tryAgainRetries): waits of 1, 2, 4 and 8 ms, 15 ms in all,
	// within Envoy's default 20 ms rate-limit timeout.
	defaultTryAgainRetries = 4
	// tryAgainBackoff is the wait before the first resend after TRYAGAIN;
	// it doubles with each resend, up to tryAgainMaxBackoff.
	tryAgainBackoff    = time.Millisecond
	tryAgainMaxBackoff = 8 * time.Millisecond
)

// isTryAgain reports whether Redis Cluster refused a call with TRYAGAIN (a
// multi-key call during a slot's migration), before running it.
func isTryAgain(err error) bool {
	return err != nil && redis.IsTryAgainError(err)
}

// tryAgainDelay is the wait before the resend n (from 0) of a call refused
// with TRYAGAIN: tryAgainBackoff, doubling with each resend, at most
// tryAgainMaxBackoff.
func tryAgainDelay(n int) time.Duration {
	return min(tryAgainBackoff<<min(n, 16), tryAgainMaxBackoff)
}

// tryAgainWait waits before the resend n (from 0) of a call that Redis
// refused with TRYAGAIN, and reports whether to resend it: false at once
// when b.tryAgainRetries resends have been made or when the wait would end
// at or past ctx's deadline, false when ctx ends during the wait.
func (b *Backend) tryAgainWait(ctx context.Context, n int) bool {
	if n >= b.tryAgainRetries {
		return false
	}
	d := tryAgainDelay(n)
	if dl, ok := ctx.Deadline(); ok && !time.Now().Add(d).Before(dl) {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// checkCluster splits the batch by hash slot and runs one check script per
// slot, in parallel (goroutines owned by this call, joined before it
// returns). A slot's script only sees its own requests, so when a slot vetoed
// the batch the slots that consumed are refunded (refund.lua) and their
// results report the figures without consumption.
//
// Consistency: between a slot's check and its refund, other Checks on the
// refunded counters see the extra count and may be denied although the limit
// would have admitted them (under-admission, for about one round trip). No
// Check is ever admitted beyond the limit. When a slot fails (network error,
// timeout) the batch is an error and the slots that consumed are refunded
// too, on a context of their own (see settle); a failed slot whose script did run before its reply was lost stays
// counted, again an over-count, never an over-admission. Neither script is
// ever resent by go-redis after a network error (see noRetry): a check run
// twice would over-count, and a refund run twice would over-admit. Failed
// refunds are counted in RefundErrors. Calls refused with TRYAGAIN, which
// did not run, are resent (see "Resending after TRYAGAIN").
func (b *Backend) checkCluster(ctx context.Context, reqs []limiter.Request, results []limiter.Result) error {
	calls := b.groupBySlot(reqs)
	if len(calls) == 1 {
		_, _, err := b.call(ctx, reqs, nil, results, nil)
		return err
	}
	var wg sync.WaitGroup
	for _, c := range calls {
		c.alt = make([]figures, len(c.idx))
		wg.Go(func() {
			c.now, c.committed, c.err = b.call(ctx, reqs, c.idx, results, c.alt)
		})
	}
	wg.Wait()
	return b.settle(ctx, reqs, calls, results)
}

// settle ends a Cluster batch of several slot calls that have run: when one
// failed or vetoed, the slots that consumed are refunded (refundAll) and
// report the figures without consumption. It waits for the refunds until
// ctx ends, not longer: a refund runs on a context of its own, so that the
// refund of a Check that ran out of time (one slot timed out) is not lost
// with it, and goes on after its caller has been answered. It returns the
// calls' errors.
func (b *Backend) settle(ctx context.Context, reqs []limiter.Request, calls []*slotCall, results []limiter.Result) error {
	errs, orders, settled := b.refundOrders(reqs, calls, results)
	if settled {
		return nil
	}
	if len(orders) > 0 {
		select {
		case <-b.refundAll(orders):
		case <-ctx.Done():
		}
	}
	for _, c := range calls {
		if c.err != nil || !c.committed {
			continue
		}
		for j, i := range c.idx {
			results[i].Remaining = c.alt[j].remaining
			results[i].ResetAfter = c.alt[j].reset
		}
	}
	return errors.Join(errs...)
}

// settleAbandoned settles the Cluster Check of reqs whose caller stopped
// waiting while its slot calls were in flight: it decodes their replies
// and refunds the slots that consumed if another failed or vetoed, as
// settle does for a caller, without anyone waiting for it.
func (b *Backend) settleAbandoned(reqs []limiter.Request, calls []*slotCall) {
	results := make([]limiter.Result, len(reqs))
	for _, c := range calls {
		if c.err == nil {
			c.now, c.committed, c.err = decodeReply(c.reply, reqs, c.idx, results, c.alt)
		}
	}
	if _, orders, _ := b.refundOrders(reqs, calls, results); len(orders) > 0 {
		b.refundAll(orders)
	}
}

// refundOrders returns the errors of the slot calls of a Cluster batch and,
// when one failed or vetoed, the refunds of the slots that consumed (none
// for a slot whose admitted requests had no hits); settled reports that
// every call committed, which needs nothing more.
func (b *Backend) refundOrders(reqs []limiter.Request, calls []*slotCall, results []limiter.Result) (errs []error, orders []refundOrder, settled bool) {
	veto := false
	for _, c := range calls {
		if c.err != nil {
			errs = append(errs, c.err)
		} else if !c.committed {
			veto = true
		}
	}
	if len(errs) == 0 && !veto {
		return nil, nil, true
	}
	for _, c := range calls {
		if c.err != nil || !c.committed {
			continue
		}
		if o := b.refundOrder(reqs, c, results); len(o.keys) > 0 {
			orders = append(orders, o)
		}
	}
	return errs, orders, false
}

// refundAll runs the refunds of orders, in parallel, in goroutines the
// Backend owns (Close waits for them), on a context bounded by the timeout
// alone (see settle). It returns a channel closed once they have all ended.
// Once Close has begun, it runs them before it returns.
func (b *Backend) refundAll(orders []refundOrder) <-chan struct{} {
	done := make(chan struct{})
	run := func() {
		defer close(done)
		ctx := context.Background()
		if b.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, b.timeout)
			defer cancel()
		}
		var wg sync.WaitGroup
		for i := range orders {
			wg.Go(func() {
				if err := b.refund(ctx, &orders[i]); err != nil {
					b.refundErrors.Add(1)
				}
			})
		}
		wg.Wait()
	}
	b.bgMu.Lock()
	if b.closing {
		b.bgMu.Unlock()
		run()
		return done
	}
	b.bg.Add(1)
	b.bgMu.Unlock()
	go func() {
		defer b.bg.Done()
		run()
	}()
	return done
}

// groupBySlot returns the requests of each hash slot, slots in order of
// their first request.
func (b *Backend) groupBySlot(reqs []limiter.Request) []*slotCall {
	var buf []slotCall
	return b.appendSlotCalls(nil, &buf, reqs)
}

// appendSlotCalls appends to calls the requests of each hash slot, slots in
// order of their first request, in slotCalls of *buf: reused (their idx and
// alt slices with them), the earlier calls it held being done with, and
// replaced by a larger array when it has fewer than len(reqs) (every
// pointer taken stays valid).
func (b *Backend) appendSlotCalls(calls []*slotCall, buf *[]slotCall, reqs []limiter.Request) []*slotCall {
	if cap(*buf) < len(reqs) {
		*buf = make([]slotCall, 0, len(reqs))
	}
	sc := (*buf)[:0]
	var key [128]byte
	for i := range reqs {
		s := slot(string(appendBaseKey(key[:0], b.prefix, &reqs[i])))
		// A request has few slots (a few descriptors' limits): a linear
		// search beats a map made per Check.
		var c *slotCall
		for _, x := range calls {
			if x.slot == s {
				c = x
				break
			}
		}
		if c == nil {
			sc = sc[:len(sc)+1] // within cap: no pointer moves
			c = &sc[len(sc)-1]
			*c = slotCall{slot: s, idx: c.idx[:0], alt: c.alt[:0]}
			calls = append(calls, c)
		}
		c.idx = append(c.idx, i)
	}
	*buf = sc
	return calls
}

// refundOrder is the refund of one slot call of a Cluster batch: what its
// admitted requests consumed, in refund.lua's arguments, owned by the order
// so that it outlives the batch's requests and results.
type refundOrder struct {
	now   string // check.lua's clock for the slot (ARGV[1])
	keys  []string
	specs []string
}

// refundOrder returns the refund of the hits consumed by the slot call c:
// those of every admitted request with hits > 0.
func (b *Backend) refundOrder(reqs []limiter.Request, c *slotCall, results []limiter.Result) refundOrder {
	o := refundOrder{now: strconv.FormatInt(c.now, 10)}
	var sb strings.Builder
	for _, i := range c.idx {
		r := &reqs[i]
		if !results[i].Allowed || r.Hits == 0 {
			continue
		}
		o.keys = append(o.keys, string(appendBaseKey(nil, b.prefix, r)))
		sb.Reset()
		sb.WriteString(strconv.Itoa(int(r.Limit.Algorithm)))
		sb.WriteByte(' ')
		sb.WriteString(strconv.FormatInt(r.Limit.Window.Milliseconds(), 10))
		sb.WriteByte(' ')
		sb.WriteString(strconv.FormatUint(r.Limit.Requests, 10))
		sb.WriteByte(' ')
		sb.WriteString(strconv.FormatUint(r.Hits, 10))
		o.specs = append(o.specs, sb.String())
	}
	return o
}

// refund runs the refund o. refund.lua is never resent by go-redis
// (sendScript): a refund that ran twice would take back twice the hits and
// let later Checks past the limit. It is resent here only when Redis
// refused it without running it: NOSCRIPT, and TRYAGAIN (see "Resending
// after TRYAGAIN").
func (b *Backend) refund(ctx context.Context, o *refundOrder) error {
	bt := b.scratch.Get().(*batch)
	defer b.scratch.Put(bt)
	defer clear(bt.cmd)
	var cmd *redis.StringCmd
	for n := 0; ; n++ {
		cmd = b.sendScript(ctx, bt, "evalsha", b.scripts.refund.Hash(), o.keys, o.specs, o.now)
		if isNoScript(cmd.Err()) {
			cmd = b.sendScript(ctx, bt, "eval", b.scripts.refundSrc, o.keys, o.specs, o.now)
		}
		if !isTryAgain(cmd.Err()) || !b.tryAgainWait(ctx, n) {
			break
		}
		b.tryAgains.Add(1)
	}
	if err := cmd.Err(); err != nil {
		return unavailable(ctx, "refund script", err)
	}
	return nil
}
