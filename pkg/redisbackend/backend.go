package redisbackend

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/redis/go-redis/v9"
)

// injectedClockSlack is added to every expiry when Options.Now is set.
const injectedClockSlack = time.Hour

// Backend is a limiter.Limiter on Redis. It is safe for concurrent use.
type Backend struct {
	client  redis.UniversalClient
	cluster *redis.ClusterClient // non-nil when client is a Cluster client
	owned   bool                 // Close closes client
	prefix  string
	timeout time.Duration
	now     func() time.Time
	scripts *scripts
	scratch sync.Pool // *batch
	// flags are check.lua's ARGV[1] without and with the no-consumption
	// figures: "<alt> <expiry slack ms>", boxed once so that a call does
	// not allocate for them.
	flags [2]any

	// functions is set while checks run as a Redis Function (FCALL); it is
	// cleared for good when the server lacks Functions or forbids them,
	// and checks run as a script (EVALSHA) from then on.
	functions atomic.Bool
	// loadSem admits one FUNCTION LOAD at a time; loads counts completed
	// loads, so that callers that failed before a load finished retry
	// instead of loading again.
	loadSem chan struct{}
	loads   atomic.Uint64

	refundErrors atomic.Uint64
	// bg counts the refunds in flight (refundAll), which Close waits for;
	// closing, under bgMu, is set once Close has begun, after which
	// refunds run in their caller.
	bg      sync.WaitGroup
	bgMu    sync.Mutex
	closing bool
	// calls counts check script calls sent, checks the Checks they
	// decided (see CallStats).
	calls, checks atomic.Uint64
	// tryAgainRetries bounds the resends of a call that Redis Cluster
	// refused with TRYAGAIN (defaultTryAgainRetries; tests change it
	// before the first Check); tryAgains counts the resends. See
	// "Resending after TRYAGAIN" in cluster.go.
	tryAgainRetries int
	tryAgains       atomic.Uint64

	// co coalesces concurrent Checks into shared calls (single node and
	// Sentinel, unless Options.Senders < 0); nil means every Check is a
	// call of its own.
	co *coalescer
}

var _ limiter.Limiter = (*Backend)(nil)

// New validates opts, creates the go-redis client of the chosen topology and
// returns a Backend that owns it. It does not contact Redis; use Ping for
// that.
func New(opts Options) (*Backend, error) {
	topo, err := opts.validate()
	if err != nil {
		return nil, fmt.Errorf("redis options: %w", err)
	}
	c, err := opts.newClient(topo)
	if err != nil {
		return nil, fmt.Errorf("redis options: %w", err)
	}
	b, err := newBackend(c, opts)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	b.owned = true
	return b, nil
}

// NewFromClient returns a Backend on an existing client (a *redis.Client,
// *redis.ClusterClient or Sentinel-backed *redis.Client). Only KeyPrefix,
// Timeout and Now of opts are used. The caller keeps ownership of c: Close
// does not close it. For exact counting c should not retry commands on its
// own (MaxRetries −1, see New). With a *redis.Client the coalescing sender
// slots hold connections of their own (c.Conn()); go-redis's maintenance
// notifications in "auto" mode race between such connections, so c should
// have them disabled, as New does. A *redis.ClusterClient should have
// MinRetryBackoff −1, as New's does: otherwise go-redis sleeps 10–30 ms
// before a pipeline follows a MOVED or ASK redirection, which every Check
// of a coalesced call meets while its slot migrates. A *redis.Client or
// *redis.ClusterClient must have ContextTimeoutEnabled, as New's have, and
// is refused without it: go-redis would then bound a call's reads and
// writes by its ReadTimeout and WriteTimeout alone, not by the Check's
// deadline nor Options.Timeout, and a stalled Redis would hold every
// caller of a coalesced call past Envoy's timeout, to succeed after it.
func NewFromClient(c redis.UniversalClient, opts Options) (*Backend, error) {
	if c == nil {
		return nil, errors.New("redisbackend: nil client")
	}
	if err := validatePrefix(opts.KeyPrefix); err != nil {
		return nil, fmt.Errorf("redis options: %w", err)
	}
	if !honoursDeadlines(c) {
		return nil, errors.New("redis options: the client's ContextTimeoutEnabled is false, so go-redis would not end a call at its deadline (Options.Timeout, the caller's): set it, as New does")
	}
	return newBackend(c, opts)
}

// honoursDeadlines reports whether go-redis ends c's calls at their
// context's deadline; true for a client whose options it cannot read.
func honoursDeadlines(c redis.UniversalClient) bool {
	switch cc := c.(type) {
	case *redis.Client:
		return cc.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return cc.Options().ContextTimeoutEnabled
	}
	return true
}

func newBackend(c redis.UniversalClient, opts Options) (*Backend, error) {
	s, err := newScripts()
	if err != nil {
		return nil, fmt.Errorf("redisbackend: load scripts: %w", err)
	}
	b := &Backend{
		client:  c,
		prefix:  opts.KeyPrefix,
		timeout: opts.Timeout,
		now:     opts.Now,
		scripts: s,
		loadSem: make(chan struct{}, 1),

		tryAgainRetries: defaultTryAgainRetries,
	}
	b.functions.Store(!opts.DisableFunctions)
	if b.prefix == "" {
		b.prefix = DefaultKeyPrefix
	}
	if b.timeout == 0 {
		b.timeout = DefaultTimeout
	}
	// Redis expires keys by its own clock. With an injected clock the
	// expiries the script computes would be in the wrong time base, so
	// keys get an hour of slack (a later expiry never changes a decision).
	slack := "0"
	if b.now != nil {
		slack = strconv.FormatInt(injectedClockSlack.Milliseconds(), 10)
	}
	b.flags = [2]any{"0 " + slack, "1 " + slack}
	b.cluster, _ = c.(*redis.ClusterClient)
	b.scratch.New = func() any { return new(batch) }
	if senders := opts.senders(); senders > 0 {
		if err := checkPool(c, senders); err != nil {
			return nil, fmt.Errorf("redis options: %w", err)
		}
		maxBatch := opts.MaxBatch
		if maxBatch == 0 {
			maxBatch = DefaultMaxBatch
		}
		b.co = newCoalescer(b, senders, maxBatch, max(opts.SpareAfter, 0))
	}
	return b, nil
}

// checkPool refuses a single-node or Sentinel client whose pool the senders
// would fill: each sender slot keeps a connection of it once it has sent,
// and FUNCTION LOAD, Ping and the heartbeat need one more. The pool's size
// is the client's own, whatever set it: --redis.pool-size, pool_size in
// --redis.url, a caller's client (NewFromClient) or go-redis's default; and
// when go-redis also caps the connections open at once (max_active_conns in
// --redis.url, or a caller's client's MaxActiveConns), the smaller of the
// two, since past that cap go-redis makes every other call wait until a
// slot's connection returns ("connection pool exhausted" at its pool
// timeout). A Cluster's slots take connections from each node's pool per
// call.
func checkPool(c redis.UniversalClient, senders int) error {
	rc, ok := c.(*redis.Client)
	if !ok {
		return nil
	}
	o := rc.Options()
	p, set := o.PoolSize, "--redis.pool-size, or pool_size in --redis.url"
	switch a := o.MaxActiveConns; {
	case a <= 0 || a > p:
	case a == p:
		set += ", and max_active_conns in --redis.url"
	default:
		p, set = a, "max_active_conns in --redis.url or a caller's client, below its pool size of "+strconv.Itoa(o.PoolSize)
	}
	if senders >= p {
		return fmt.Errorf("--redis.senders %d leaves no connection of the client's pool of %d (%s) for the other calls (function loads, pings, heartbeats): the pool must be larger than the senders", senders, p, set)
	}
	return nil
}

// Close stops coalescing (the calls in flight end first, or are ended after
// Options.Timeout), waits for the Cluster refunds in flight (each bounded by
// Options.Timeout) and closes the client if New created it.
// Calls after Close fail with limiter.ErrUnavailable (with NewFromClient,
// coalesced calls do; the others go on while the caller's client is open).
func (b *Backend) Close() error {
	stopped := true
	if b.co != nil {
		// Let the calls in flight end and their slots close their
		// connections (closing the client under a slot's connection makes
		// go-redis log), for as long as a call may take; then close the
		// client, which also ends a call without a deadline. With a
		// caller's client, wait for them.
		grace := max(b.timeout, 0)
		if !b.owned {
			grace = -1
		}
		stopped = b.co.close(grace)
	}
	b.bgMu.Lock()
	b.closing = true
	b.bgMu.Unlock()
	b.bg.Wait()
	var err error
	if b.owned {
		err = b.client.Close()
	}
	if !stopped {
		b.co.close(-1)
	}
	return err
}

// Ping reports whether Redis answers (every master in Cluster mode), for
// readiness probes. Until a Functions library load succeeded it also loads
// the library (see Options.DisableFunctions), so that the first check does
// not pay for it. Errors wrap limiter.ErrUnavailable.
func (b *Backend) Ping(ctx context.Context) error {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	var err error
	if b.cluster != nil {
		err = b.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Ping(ctx).Err()
		})
	} else {
		err = b.client.Ping(ctx).Err()
	}
	if err != nil {
		return unavailable(ctx, "ping", err)
	}
	if b.functions.Load() && b.loads.Load() == 0 {
		// Warm up: load the library now rather than on the first check.
		if err := b.loadLibrary(ctx, 0); err != nil {
			if !isUnsupported(err) {
				return unavailable(ctx, "load the function library", err)
			}
			b.functions.Store(false)
		}
	}
	return nil
}

// RefundErrors returns how many Cluster refunds failed since the Backend was
// created. A failed refund leaves hits counted that were not admitted (the
// counter over-counts until its window ends); it never over-admits.
func (b *Backend) RefundErrors() uint64 { return b.refundErrors.Load() }

// CallStats are the backend's counters since it was created.
type CallStats struct {
	// Checks is the number of Checks sent to Redis, Calls the number of
	// check script calls that decided them: one per Check without
	// coalescing (one per hash slot in Cluster mode), fewer with it.
	Checks, Calls uint64
	// SpareCalls is the number of coalesced calls a spare slot started
	// while another slot's call was in flight (see Options.SpareAfter).
	SpareCalls uint64
	// RefundErrors is RefundErrors().
	RefundErrors uint64
	// TryAgainRetries is the number of script calls (checks and Cluster
	// refunds) sent again because Redis Cluster refused them with
	// TRYAGAIN, without running them, while their hash slot migrated
	// (see "Resending after TRYAGAIN" in cluster.go). Calls counts a
	// call once however often it was sent.
	TryAgainRetries uint64
}

// CallStats returns the counters of checks and calls. Checks/Calls is the
// average number of Checks a coalesced call carried.
func (b *Backend) CallStats() CallStats {
	st := CallStats{Checks: b.checks.Load(), Calls: b.calls.Load(), RefundErrors: b.refundErrors.Load(), TryAgainRetries: b.tryAgains.Load()}
	if b.co != nil {
		st.SpareCalls = b.co.spares.Load()
	}
	return st
}

// Check implements limiter.Limiter. See the package documentation for the
// number of Redis calls per Check.
func (b *Backend) Check(ctx context.Context, reqs []limiter.Request, results []limiter.Result) error {
	return b.CheckBy(ctx, time.Time{}, reqs, results)
}

// CheckBy is Check bounded by by as well (zero: not), as if ctx ended then:
// it returns by then, with an error that wraps limiter.ErrUnavailable and
// context.DeadlineExceeded if Redis has not decided. With coalescing no
// context is derived for it (the fail-soft layer's shortened deadline, given
// this way, costs no allocation).
func (b *Backend) CheckBy(ctx context.Context, by time.Time, reqs []limiter.Request, results []limiter.Result) error {
	if err := validate(reqs, results); err != nil {
		return err
	}
	if len(reqs) == 0 {
		return nil
	}
	b.checks.Add(1)
	dl := earliest(b.deadline(ctx), by)
	if b.co != nil {
		// No derived context per request: the coalesced call carries the
		// deadline, and the coalescer's expiry answers a queued Check at it.
		return b.co.check(ctx, dl, reqs, results)
	}
	ctx, cancel := boundBy(ctx, dl)
	defer cancel()
	if b.cluster != nil {
		err := b.checkCluster(ctx, reqs, results)
		if err != nil {
			// A failed node may have been replaced by its replica: refresh
			// the slot map now rather than at go-redis's next periodic
			// reload (about a minute). The reload is asynchronous and
			// coalesced by go-redis, so a burst of failures costs one.
			b.cluster.ReloadState(ctx)
		}
		return err
	}
	_, _, err := b.call(ctx, reqs, nil, results, nil)
	return err
}

// deadline returns when a call for ctx must end: ctx's deadline or b.timeout
// from now, whichever is sooner; zero when neither bounds it.
func (b *Backend) deadline(ctx context.Context) time.Time {
	dl, ok := ctx.Deadline()
	if b.timeout > 0 {
		if t := time.Now().Add(b.timeout); !ok || t.Before(dl) {
			return t
		}
	}
	if !ok {
		return time.Time{}
	}
	return dl
}

// bound applies b.timeout to ctx unless ctx already ends sooner.
func (b *Backend) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return boundBy(ctx, b.deadline(ctx))
}

// boundBy returns ctx ended at dl (zero: ctx itself), unless ctx already
// ends by then.
func boundBy(ctx context.Context, dl time.Time) (context.Context, context.CancelFunc) {
	if cur, ok := ctx.Deadline(); dl.IsZero() || ok && !dl.Before(cur) {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, dl)
}

// earliest returns the sooner of two deadlines, where zero is none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
}

// validate checks the arguments of Check.
func validate(reqs []limiter.Request, results []limiter.Result) error {
	if len(results) != len(reqs) {
		return fmt.Errorf("%w: %d results for %d requests", limiter.ErrInvalid, len(results), len(reqs))
	}
	for i := range reqs {
		r := &reqs[i]
		if r.Key == "" {
			return fmt.Errorf("%w: request %d: empty key", limiter.ErrInvalid, i)
		}
		if err := r.Limit.Validate(); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		if err := exactRange(r); err != nil {
			return fmt.Errorf("%w: request %d: %w", limiter.ErrInvalid, i, err)
		}
	}
	return nil
}

// exactRange reports whether the scripts count r exactly: its limit within
// limiter's exact range (the configuration refuses any other), its hits
// below 2^53 (pkg/rls sends hits beyond a limit's capacity as capacity+1).
func exactRange(r *limiter.Request) error {
	if err := r.Limit.ExactRange(); err != nil {
		return err
	}
	if r.Hits > limiter.MaxExact {
		return fmt.Errorf("%d hits exceed the exact range of the Redis scripts (2^53)", r.Hits)
	}
	return nil
}

// unavailable wraps a store failure. When the context has ended, its error
// is wrapped too (go-redis reports an expired deadline as the socket's i/o
// timeout), so errors.Is(err, context.DeadlineExceeded) holds.
func unavailable(ctx context.Context, op string, err error) error {
	cerr := ctx.Err()
	if dl, ok := ctx.Deadline(); ok && cerr == nil && !time.Now().Before(dl) {
		// The socket deadline (the context's) can fire just before the
		// context's own timer.
		cerr = context.DeadlineExceeded
	}
	if cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: redis %s: %w (%w)", limiter.ErrUnavailable, op, err, cerr)
	}
	return fmt.Errorf("%w: redis %s: %w", limiter.ErrUnavailable, op, err)
}

// figures are the remaining and reset of a request without the batch's
// consumption (check.lua's remaining0, reset0).
type figures struct {
	remaining uint64
	reset     time.Duration
}

// group is one batch of requests encoded for check.lua: its keys, and its
// ARGV entry "<n>;<spec>;...;<spec>" (or "<n> <now>;..." with an injected
// clock), the group's text that check.lua parses once and caches. All of
// them are substrings of one string, allocated once per group; the slices
// are reused.
type group struct {
	buf  []byte
	offs []int
	keys []string
	argv []string
}

// encode fills g with the requests reqs[idx[j]] (all of reqs when idx is
// nil).
func (g *group) encode(b *Backend, reqs []limiter.Request, idx []int) {
	n := len(reqs)
	if idx != nil {
		n = len(idx)
	}
	buf, offs := g.buf[:0], g.offs[:0]
	// Layout of buf: every key, then the group's text.
	offs = append(offs, 0)
	for j := 0; j < n; j++ {
		buf = appendBaseKey(buf, b.prefix, &reqs[at(idx, j)])
		offs = append(offs, len(buf))
	}
	buf = strconv.AppendInt(buf, int64(n), 10)
	if b.now != nil {
		buf = append(buf, ' ')
		buf = strconv.AppendInt(buf, b.now().UnixMilli(), 10)
	}
	for j := 0; j < n; j++ {
		buf = append(buf, ';')
		buf = appendSpec(buf, &reqs[at(idx, j)])
	}
	s := string(buf)
	keys := g.keys[:0]
	for j := 0; j < n; j++ {
		keys = append(keys, s[offs[j]:offs[j+1]])
	}
	argv := append(g.argv[:0], s[offs[n]:])
	g.buf, g.offs, g.keys, g.argv = buf, offs, keys, argv
}

// release drops g's references to its string, so that a pooled group does
// not keep it alive.
func (g *group) release() {
	clear(g.keys)
	clear(g.argv)
	g.keys, g.argv = g.keys[:0], g.argv[:0]
}

// at is the index of the j-th request of a group: idx[j], or j when idx is
// nil.
func at(idx []int, j int) int {
	if idx == nil {
		return j
	}
	return idx[j]
}

// groupReplyLen returns the length in bytes of the part of check.lua's
// reply at the start of v that holds a group of n requests (with the
// figures without consumption when alt): the group's clock, then per
// request its decision, its reset, its retry only when the decision is a
// denial (negative), and with alt the two figures; all little-endian
// 64-bit integers. ok is false when v is too short to hold it.
func groupReplyLen(v string, n int, alt bool) (size int, ok bool) {
	size = 8
	for range n {
		if size+16 > len(v) {
			return 0, false
		}
		k := 16
		if int64(binary.LittleEndian.Uint64([]byte(v[size:size+8]))) < 0 {
			k = 24
		}
		if alt {
			k += 16
		}
		size += k
	}
	return size, size <= len(v)
}

// decodeReply writes the results of the requests reqs[idx[j]] (all of reqs
// when idx is nil) from v, the group's part of check.lua's reply (see
// groupReplyLen), which it must fill exactly. With alt non-nil it reads the
// figures without consumption too. It returns the group's clock and whether
// it consumed: whether no request but a shadow one was denied, as
// check.lua decides it.
func decodeReply(v string, reqs []limiter.Request, idx []int, results []limiter.Result, alt []figures) (now int64, committed bool, err error) {
	n := len(reqs)
	if idx != nil {
		n = len(idx)
	}
	size, ok := groupReplyLen(v, n, alt != nil)
	if !ok || size != len(v) {
		return 0, false, fmt.Errorf("reply has %d bytes, which is not a group of %d requests", len(v), n)
	}
	var bad, inconsistent bool
	int64At := func(off int) int64 { return int64(binary.LittleEndian.Uint64([]byte(v[off : off+8]))) }
	num := func(off int) int64 {
		x := int64At(off)
		if x < 0 {
			bad = true
		}
		return x
	}
	now = num(0)
	committed = true
	off := 8
	for j := range n {
		// The decision: remaining when allowed, -1 - remaining when denied,
		// and then a retry, which every algorithm makes at least 1 ms.
		d := int64At(off)
		allowed, remaining := d >= 0, d
		reset := num(off + 8)
		off += 16
		var retry int64
		if !allowed {
			remaining = -1 - d
			retry = num(off)
			if retry < 1 {
				inconsistent = true
			}
			off += 8
			if !reqs[at(idx, j)].Shadow {
				committed = false
			}
		}
		results[at(idx, j)] = limiter.Result{
			Allowed:    allowed,
			Remaining:  uint64(remaining),
			ResetAfter: limiter.Millis(reset),
			RetryAfter: limiter.Millis(retry),
			Source:     limiter.SourceStore,
		}
		if alt != nil {
			alt[j] = figures{remaining: uint64(num(off)), reset: limiter.Millis(num(off + 8))}
			off += 16
		}
	}
	if bad {
		return 0, false, errors.New("reply holds a negative value where a non-negative integer belongs")
	}
	if inconsistent {
		return 0, false, errors.New("reply holds a denial without a retry")
	}
	return now, committed, nil
}

// batch is the scratch space of one script call, reused through a pool (a
// coalescing sender slot keeps its own).
type batch struct {
	g    group
	keys []string
	argv []string
	cmd  []any // the command's arguments: pointers into keys and argv
	// conn, when set, is the connection the calls go through instead of
	// the client's pool (a coalescing sender slot's own; see coalescer).
	conn  *redis.Conn
	jobs  []*job // the jobs of a coalesced call
	parts []part // and their groups' calls
	// pipe holds a Cluster pipeline's calls (sendPipelined), pipeBy their
	// indexes by hash slot·2 + alt, both empty between pipelines.
	pipe   []pipeCall
	pipeBy map[int]int
	// start is when a coalescing slot was lent out: zero while it is
	// idle, and always when the coalescer has no spareAfter (under
	// coalescer.mu).
	start time.Time
}

// closeConn closes bt's own connection, if any.
func (bt *batch) closeConn() {
	if bt.conn != nil {
		_ = bt.conn.Close()
		bt.conn = nil
	}
}

// call runs check.lua for the requests reqs[idx[j]] (all of reqs when idx is
// nil) as a call of its own and writes their results. With alt non-nil
// (len(alt) = number of requests of the call) the script also returns the
// figures without consumption. It returns the script's clock and whether it
// consumed.
func (b *Backend) call(ctx context.Context, reqs []limiter.Request, idx []int, results []limiter.Result, alt []figures) (now int64, committed bool, err error) {
	bt := b.scratch.Get().(*batch)
	defer b.scratch.Put(bt)
	bt.g.encode(b, reqs, idx)
	defer bt.g.release()
	flags := b.flags[0]
	if alt != nil {
		flags = b.flags[1]
	}
	b.calls.Add(1)
	cmd := b.runCheck(ctx, bt, bt.g.keys, bt.g.argv, flags)
	// Do not keep the strings alive through the pool.
	defer clear(bt.cmd)
	v, err := cmd.Result()
	if err != nil {
		return 0, false, unavailable(ctx, "check script", err)
	}
	now, committed, err = decodeReply(v, reqs, idx, results, alt)
	if err != nil {
		return 0, false, unavailable(ctx, "check script", err)
	}
	return now, committed, nil
}

// runCheck runs check.lua on keys and argv (argv[1], the flags, is given
// boxed as flags): with FCALL while b.functions is set, loading the library
// when the server does not have it (a restart without persistence, FUNCTION
// FLUSH) and falling back to scripts for good when the server has no
// Functions; otherwise with EVALSHA, and with EVAL when Redis does not know
// the script yet, as redis.Script.Run does; and it sends the call again,
// after a wait, when Redis Cluster refused it with TRYAGAIN (see
// "Resending after TRYAGAIN" in cluster.go). Every retry here follows an
// error that Redis returns before running anything, so no check is ever
// counted twice. keys and argv must stay unchanged until the returned
// command has been read.
func (b *Backend) runCheck(ctx context.Context, bt *batch, keys, argv []string, flags any) *redis.StringCmd {
	for n := 0; ; n++ {
		cmd := b.runCheckOnce(ctx, bt, keys, argv, flags)
		if !isTryAgain(cmd.Err()) || !b.tryAgainWait(ctx, n) {
			return cmd
		}
		b.tryAgains.Add(1)
	}
}

// runCheckOnce is runCheck without the resends after TRYAGAIN.
func (b *Backend) runCheckOnce(ctx context.Context, bt *batch, keys, argv []string, flags any) *redis.StringCmd {
	if b.functions.Load() {
		loads := b.loads.Load()
		cmd := b.sendScript(ctx, bt, "fcall", b.scripts.checkFn, keys, argv, flags)
		err := cmd.Err()
		if err == nil || (!isFunctionMissing(err) && !isUnsupported(err)) {
			return cmd
		}
		if isFunctionMissing(err) {
			lerr := b.loadLibrary(ctx, loads)
			if lerr == nil {
				return b.sendScript(ctx, bt, "fcall", b.scripts.checkFn, keys, argv, flags)
			}
			if !isUnsupported(lerr) {
				cmd.SetErr(fmt.Errorf("load the function library: %w", lerr))
				return cmd
			}
		}
		b.functions.Store(false)
	}
	cmd := b.sendScript(ctx, bt, "evalsha", b.scripts.checkSHA, keys, argv, flags)
	if isNoScript(cmd.Err()) {
		cmd = b.sendScript(ctx, bt, "eval", b.scripts.checkSrc, keys, argv, flags)
	}
	return cmd
}

// sendScript sends "<verb> <script> <numkeys> <keys> <flags> <argv>", its
// arguments built in bt.cmd (appendCheckArgs), on bt's connection if it has
// one, never to be resent (noRetry). flags is the script's ARGV[1].
func (b *Backend) sendScript(ctx context.Context, bt *batch, verb, script any, keys, argv []string, flags any) *redis.StringCmd {
	args := appendCheckArgs(bt.cmd[:0], verb, script, keys, argv, flags)
	bt.cmd = args
	cmd := redis.NewStringCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	if bt.conn != nil {
		_ = bt.conn.Process(ctx, noRetry{cmd})
	} else {
		_ = b.client.Process(ctx, noRetry{cmd})
	}
	return cmd
}

// appendCheckArgs appends the arguments of "<verb> <script> <numkeys> <keys>
// <flags> <argv>" to dst, every key and argument as a *string into keys and
// argv: go-redis writes it as the string, and no argument is boxed on the
// heap (verb comes boxed: a string constant converted where it is written,
// which costs nothing, where a string variable converted here would cost an
// allocation per call). keys and argv must stay unchanged until the command
// has been read.
func appendCheckArgs(dst []any, verb, script any, keys, argv []string, flags any) []any {
	dst = append(dst, verb, script, len(keys))
	for i := range keys {
		dst = append(dst, &keys[i])
	}
	dst = append(dst, flags)
	for i := range argv {
		dst = append(dst, &argv[i])
	}
	return dst
}

// noRetry is a script command that go-redis must not send again after a
// network error or a timeout: the script may have run before the reply was
// lost, and a second run would count a check's hits twice (an over-count)
// or take a refund back twice (an over-admission). New's clients do not
// retry (MaxRetries −1), but a Cluster client resends after a connection
// error on its own (up to MaxRedirects times, whatever MaxRetries says), and
// a client given to NewFromClient may retry. Redirections (MOVED, ASK) are
// still followed: a redirected command did not run. Neither did one refused
// with TRYAGAIN, which go-redis does not resend when it is noRetry:
// envoy-rls resends it itself (see "Resending after TRYAGAIN" in
// cluster.go).
type noRetry struct{ *redis.StringCmd }

// NoRetry implements redis.Cmder.
func (noRetry) NoRetry() bool { return true }

// loadLibrary loads the Functions library (on every master in Cluster
// mode) unless another caller completed a load since loads was read. One
// load runs at a time; callers wait for it within ctx.
func (b *Backend) loadLibrary(ctx context.Context, loads uint64) error {
	select {
	case b.loadSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-b.loadSem }()
	if b.loads.Load() != loads {
		return nil
	}
	var err error
	if b.cluster != nil {
		err = b.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.FunctionLoadReplace(ctx, b.scripts.library).Err()
		})
	} else {
		err = b.client.FunctionLoadReplace(ctx, b.scripts.library).Err()
	}
	if err != nil {
		return err
	}
	b.loads.Add(1)
	return nil
}

// isNoScript reports whether Redis answered that it does not know the script
// (EVALSHA before the script was loaded or after SCRIPT FLUSH).
func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// isFunctionMissing reports whether Redis answered that it does not know the
// function (FCALL before FUNCTION LOAD).
func isFunctionMissing(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "Function not found")
}

// isUnsupported reports whether Redis refused a Functions command as unknown
// (before 7.0, or a proxy without it) or not permitted (ACL).
func isUnsupported(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "unknown command") || redis.HasErrorPrefix(err, "NOPERM"))
}

// UsesFunctions reports whether checks currently run as a Redis Function
// (FCALL) rather than as a script (EVALSHA); see Options.DisableFunctions.
// It turns false for good the first time the server refuses Functions.
func (b *Backend) UsesFunctions() bool { return b.functions.Load() }

// appendSpec appends check.lua's request spec
// "<alg> <window_ms> <limit> <capacity> <hits> <shadow>".
func appendSpec(dst []byte, r *limiter.Request) []byte {
	dst = strconv.AppendUint(dst, uint64(r.Limit.Algorithm), 10)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, r.Limit.Window.Milliseconds(), 10)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, r.Limit.Requests, 10)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, r.Limit.Capacity(), 10)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, r.Hits, 10)
	if r.Shadow {
		return append(dst, " 1"...)
	}
	return append(dst, " 0"...)
}
