package failsoft

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// Defaults of Options and BreakerOptions.
const (
	// DefaultHeartbeatInterval is how often Run announces this instance.
	// The heartbeat's time to live is three intervals, so an instance is
	// counted until it missed three beats.
	DefaultHeartbeatInterval = 5 * time.Second
	// DefaultDeadlineMargin is the time kept back from the caller's
	// deadline for the fallback decision and the way back to Envoy.
	DefaultDeadlineMargin = 5 * time.Millisecond

	// DefaultConsecutiveFailures opens the breaker after that many store
	// failures in a row.
	DefaultConsecutiveFailures = 5
	// DefaultMinRequests and DefaultFailureRatio open the breaker when, within
	// the breaker's Interval, at least MinRequests calls were made and at
	// least FailureRatio of them failed.
	DefaultMinRequests  = 20
	DefaultFailureRatio = 0.5
	// DefaultBreakerInterval is the rolling window (in buckets of
	// DefaultBucketPeriod) over which the closed breaker counts failures.
	DefaultBreakerInterval = 10 * time.Second
	DefaultBucketPeriod    = time.Second
	// DefaultOpenTimeout is how long the open breaker keeps requests away
	// from the store before it lets probes through (half-open).
	DefaultOpenTimeout = time.Second
	// DefaultHalfOpenRequests is how many probes the half-open breaker lets
	// through at once; that many consecutive successes close it, one failure
	// opens it again.
	DefaultHalfOpenRequests = 3
)

// Heartbeat announces a live instance to the shared store and reports how
// many instances are live. pkg/redisbackend's Backend implements it.
type Heartbeat interface {
	// Beat records that the instance id is alive for ttl and returns the
	// number of live instances, including this one.
	Beat(ctx context.Context, id string, ttl time.Duration) (int, error)
}

// Observer receives what an operator wants as metrics. Its methods must be
// fast and safe for concurrent use; BreakerState is called while the breaker
// holds its lock and must not call back into the Limiter.
type Observer interface {
	// FallbackActive reports a transition: true when decisions start being
	// made by failure_mode, false when the store decides again.
	FallbackActive(active bool)
	// BreakerState reports a breaker transition to "closed", "half-open" or
	// "open".
	BreakerState(state string)
	// StoreError counts one failed store call by kind: "timeout",
	// "connection", "tls", "cluster", "other", or "circuit_open" for a
	// Check that the open (or saturated half-open) breaker kept from the
	// store.
	StoreError(kind string)
}

// BreakerOptions configures the circuit breaker in front of the primary.
// Zero fields take the documented defaults.
type BreakerOptions struct {
	// ConsecutiveFailures opens the breaker after that many failures in a
	// row within Interval. Default 5: a dead store trips the breaker after
	// five requests, whatever the traffic.
	ConsecutiveFailures uint32
	// MinRequests and FailureRatio open the breaker when within Interval at
	// least MinRequests calls were made and at least FailureRatio of them
	// failed. Defaults 20 and 0.5: a store failing every other call (a
	// flapping link, a cluster with one master down) is left alone too.
	MinRequests  uint32
	FailureRatio float64
	// Interval is the rolling window over which failures are counted, in
	// buckets of BucketPeriod. Defaults 10s and 1s.
	Interval     time.Duration
	BucketPeriod time.Duration
	// OpenTimeout is how long the open breaker decides without the store
	// before it probes again. Default 1s: short enough that a restarted
	// store is used again within about a second, long enough that a dead
	// one costs one probe per second instead of a timeout per request.
	OpenTimeout time.Duration
	// HalfOpenRequests is how many probes may be in flight while
	// half-open, and how many consecutive successes close the breaker.
	// Default 3.
	HalfOpenRequests uint32
}

// Options configures New. Zero fields take the documented defaults.
type Options struct {
	// Primary is the shared store's limiter. Required. When it is also a
	// DeadlineChecker, its deadline is given through CheckBy instead of a
	// context derived per Check.
	Primary limiter.Limiter
	// Fallback decides fallback-mode requests while the primary is
	// unavailable, at this instance's share of each limit. Required.
	Fallback limiter.Limiter
	// Heartbeat, when set, is used by Run to announce this instance and to
	// learn the number of live instances. Optional.
	Heartbeat Heartbeat
	// InstanceID names this instance in heartbeats. Default: hostname, pid
	// and 8 random hex digits, e.g. "rls-7f9c-1234-5e3a9b01".
	InstanceID string
	// HeartbeatInterval is the time between two beats; the heartbeat lives
	// for three intervals. Default 5s.
	HeartbeatInterval time.Duration
	// Instances, when positive, is the number of instances the limit is
	// shared by while the store is down (the --fallback.instances flag); it
	// disables learning, but Run still beats so that others count this
	// instance. 0 learns the number from heartbeats, starting from 1 and
	// keeping the last known value while the store is down.
	Instances int
	// DeadlineMargin is kept back from the caller's deadline: the primary
	// is called with a deadline of (caller's deadline − DeadlineMargin), so
	// that a slow store still leaves time for a fallback answer. Default
	// 5ms: a healthy Redis answers in about a millisecond, so 15 of Envoy's
	// default 20 ms lose nothing; a fallback decision takes microseconds,
	// and the rest absorbs GC pauses, scheduling delays and the way back
	// to Envoy. With a caller deadline less than the margin away, the
	// store is not asked at all.
	DeadlineMargin time.Duration
	// Timeout, when positive, also bounds every primary call (for callers
	// without a deadline). Default 0: only the caller's deadline and the
	// primary's own timeout apply.
	Timeout time.Duration
	// DenyRetryAfter is the RetryAfter of a deny-mode decision. Default:
	// the breaker's OpenTimeout, at least 1s — the earliest time the store
	// might decide again.
	DenyRetryAfter time.Duration
	// Breaker configures the circuit breaker.
	Breaker BreakerOptions
	// Now is the clock used to measure outages for the logs. Default
	// time.Now. (The breaker itself runs on the wall clock.)
	Now func() time.Time
	// Logger receives transition logs. Default: discard.
	Logger *slog.Logger
	// Observer, when set, receives transitions and store errors for
	// metrics.
	Observer Observer
}

// Limiter is a limiter.Limiter that asks the primary and, when the primary is
// unavailable, decides by each request's failure mode. It is safe for
// concurrent use; Run must be called at most once.
type Limiter struct {
	primary        limiter.Limiter
	primaryBy      DeadlineChecker // primary, when it is one; else nil
	fallback       limiter.Limiter
	hb             Heartbeat
	id             string
	interval       time.Duration
	override       int
	margin         time.Duration
	timeout        time.Duration
	denyRetryAfter time.Duration
	now            func() time.Time
	log            *slog.Logger
	obs            Observer

	cb *gobreaker.TwoStepCircuitBreaker[struct{}]

	live        atomic.Int64 // learned number of live instances (≥ 1)
	openTimeout time.Duration

	degraded atomic.Bool           // the breaker is not closed
	since    atomic.Int64          // Now().UnixNano() when the breaker left closed
	lastErr  atomic.Pointer[error] // the latest store failure, for the outage log
}

// DeadlineChecker is a primary that can be given a deadline apart from its
// context: CheckBy(ctx, by, …) must return by `by` (zero: no bound beyond
// ctx) as if ctx ended then, with an error that wraps
// context.DeadlineExceeded or limiter.ErrUnavailable when the store has not
// decided. The Limiter then passes the caller's context itself with the
// shortened deadline, instead of deriving a context per Check, which costs
// allocations, a timer and a registration with the caller's context
// (redisbackend.Backend).
type DeadlineChecker interface {
	CheckBy(ctx context.Context, by time.Time, reqs []limiter.Request, results []limiter.Result) error
}

// errExcluded marks a primary call whose outcome says nothing about the
// store's health (the caller gave up, the request was malformed); the
// breaker ignores it.
var errExcluded = errors.New("failsoft: outcome not counted")

// New returns a Limiter over o.Primary and o.Fallback.
func New(o Options) (*Limiter, error) {
	if o.Primary == nil || o.Fallback == nil {
		return nil, errors.New("failsoft: Primary and Fallback are required")
	}
	if o.Instances < 0 {
		return nil, fmt.Errorf("failsoft: Instances %d is negative", o.Instances)
	}
	if o.HeartbeatInterval < 0 || o.DeadlineMargin < 0 || o.Timeout < 0 || o.DenyRetryAfter < 0 {
		return nil, errors.New("failsoft: durations must not be negative")
	}
	b := o.Breaker
	if b.FailureRatio < 0 || b.FailureRatio > 1 {
		return nil, fmt.Errorf("failsoft: breaker failure ratio %v is not within [0, 1]", b.FailureRatio)
	}
	if b.Interval < 0 || b.BucketPeriod < 0 || b.OpenTimeout < 0 {
		return nil, errors.New("failsoft: breaker durations must not be negative")
	}
	if b.ConsecutiveFailures == 0 {
		b.ConsecutiveFailures = DefaultConsecutiveFailures
	}
	if b.MinRequests == 0 {
		b.MinRequests = DefaultMinRequests
	}
	if b.FailureRatio == 0 {
		b.FailureRatio = DefaultFailureRatio
	}
	if b.Interval == 0 {
		b.Interval = DefaultBreakerInterval
	}
	if b.BucketPeriod == 0 {
		b.BucketPeriod = min(DefaultBucketPeriod, b.Interval)
	}
	if b.OpenTimeout == 0 {
		b.OpenTimeout = DefaultOpenTimeout
	}
	if b.HalfOpenRequests == 0 {
		b.HalfOpenRequests = DefaultHalfOpenRequests
	}

	l := &Limiter{
		primary:        o.Primary,
		fallback:       o.Fallback,
		hb:             o.Heartbeat,
		id:             o.InstanceID,
		interval:       o.HeartbeatInterval,
		override:       o.Instances,
		margin:         o.DeadlineMargin,
		timeout:        o.Timeout,
		denyRetryAfter: o.DenyRetryAfter,
		openTimeout:    b.OpenTimeout,
		now:            o.Now,
		log:            o.Logger,
		obs:            o.Observer,
	}
	if l.id == "" {
		id, err := defaultInstanceID()
		if err != nil {
			return nil, err
		}
		l.id = id
	}
	if l.interval == 0 {
		l.interval = DefaultHeartbeatInterval
	}
	if l.margin == 0 {
		l.margin = DefaultDeadlineMargin
	}
	if l.denyRetryAfter == 0 {
		l.denyRetryAfter = max(b.OpenTimeout, time.Second)
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.obs == nil {
		l.obs = nopObserver{}
	}
	l.primaryBy, _ = o.Primary.(DeadlineChecker)
	l.live.Store(1)

	ratio := b.FailureRatio
	l.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         "store",
		MaxRequests:  b.HalfOpenRequests,
		Interval:     b.Interval,
		BucketPeriod: b.BucketPeriod,
		Timeout:      b.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			if c.ConsecutiveFailures >= b.ConsecutiveFailures {
				return true
			}
			n := c.TotalSuccesses + c.TotalFailures
			return n >= b.MinRequests && float64(c.TotalFailures) >= ratio*float64(n)
		},
		OnStateChange: l.breakerChanged,
		IsExcluded:    func(err error) bool { return errors.Is(err, errExcluded) },
	})
	return l, nil
}

func defaultInstanceID() (string, error) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("failsoft: instance id: %w", err)
	}
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:])), nil
}

// InstanceID returns the name this instance beats under.
func (l *Limiter) InstanceID() string { return l.id }

// Instances returns N, the number of instances a limit is shared by in
// fallback mode: Options.Instances when set, otherwise the last number of
// live instances learned from heartbeats (1 until one succeeded).
func (l *Limiter) Instances() int {
	if l.override > 0 {
		return l.override
	}
	return int(l.live.Load())
}

// State returns the breaker's state: "closed", "half-open" or "open".
func (l *Limiter) State() string { return l.cb.State().String() }

// FallbackActive reports whether the store is considered unavailable: the
// breaker is open or half-open, so most decisions are made by failure_mode.
func (l *Limiter) FallbackActive() bool { return l.degraded.Load() }

// Check implements limiter.Limiter. It returns an error only for a malformed
// batch (limiter.ErrInvalid), when ctx ended before the primary answered
// without the store being at fault, or when the primary failed with an error
// that does not wrap limiter.ErrUnavailable. A store outage is answered by
// failure_mode, never with an error.
func (l *Limiter) Check(ctx context.Context, reqs []limiter.Request, results []limiter.Result) error {
	if len(results) != len(reqs) {
		return fmt.Errorf("%w: %d results for %d requests", limiter.ErrInvalid, len(results), len(reqs))
	}
	done, err := l.cb.Allow()
	if err != nil {
		// Open, or half-open with its probes already in flight.
		l.obs.StoreError("circuit_open")
		return l.degrade(ctx, reqs, results)
	}
	deadline, ok := l.primaryDeadline(ctx)
	if !ok {
		// Less than the margin left: no time to ask the store. That says
		// nothing about the store's health.
		done(errExcluded)
		if err := ctx.Err(); err != nil {
			return err
		}
		return l.degrade(ctx, reqs, results)
	}
	shortened, err := l.checkPrimary(ctx, deadline, reqs, results)
	switch {
	case err == nil:
		done(nil)
		return nil
	case errors.Is(ctx.Err(), context.Canceled):
		// The caller gave up: nobody waits for an answer, and the
		// store's health is unknown.
		done(errExcluded)
		return err
	case errors.Is(err, limiter.ErrUnavailable),
		shortened && errors.Is(err, context.DeadlineExceeded):
		cause := err            // a copy, so that err itself stays off the heap
		l.lastErr.Store(&cause) // the cause the breaker logs if this call opens it
		done(err)
		l.obs.StoreError(errorKind(err))
		return l.degrade(ctx, reqs, results)
	default:
		// The batch is malformed, or the primary failed in a way that is
		// not an outage: not the store's health, and not ours to hide.
		done(errExcluded)
		return err
	}
}

// primaryDeadline returns the deadline of the primary call (zero: none):
// ctx's moved earlier by the margin, and bounded by the Timeout option. ok
// is false when less than the margin is left.
func (l *Limiter) primaryDeadline(ctx context.Context) (deadline time.Time, ok bool) {
	if d, ok := ctx.Deadline(); ok {
		deadline = d.Add(-l.margin)
		if time.Until(deadline) <= 0 {
			return time.Time{}, false
		}
	}
	if l.timeout > 0 {
		if t := time.Now().Add(l.timeout); deadline.IsZero() || t.Before(deadline) {
			deadline = t
		}
	}
	return deadline, true
}

// checkPrimary asks the primary, bounded by deadline (zero: ctx alone).
// shortened reports that the primary's time was up when it returned: its
// deadline had passed, or ctx had ended.
func (l *Limiter) checkPrimary(ctx context.Context, deadline time.Time, reqs []limiter.Request, results []limiter.Result) (shortened bool, err error) {
	switch {
	case deadline.IsZero():
		err = l.primary.Check(ctx, reqs, results)
		return ctx.Err() != nil, err
	case l.primaryBy != nil:
		err = l.primaryBy.CheckBy(ctx, deadline, reqs, results)
		return ctx.Err() != nil || !time.Now().Before(deadline), err
	}
	pctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err = l.primary.Check(pctx, reqs, results)
	return pctx.Err() != nil, err
}

// breakerChanged is the breaker's OnStateChange. It runs synchronously
// inside the breaker (under its lock), from the Check whose outcome caused
// the transition. Leaving closed starts an outage, returning to closed ends
// it; half-open ↔ open flips within an outage are logged at debug level.
func (l *Limiter) breakerChanged(_ string, from, to gobreaker.State) {
	l.obs.BreakerState(to.String())
	switch {
	case from == gobreaker.StateClosed:
		l.since.Store(l.now().UnixNano())
		l.degraded.Store(true)
		var cause any = "unknown"
		if e := l.lastErr.Load(); e != nil {
			cause = *e
		}
		l.log.Warn("store unavailable: deciding by failure_mode", "error", cause,
			"instances", l.Instances(), "probe_after", l.openTimeout)
		l.obs.FallbackActive(true)
	case to == gobreaker.StateClosed:
		l.degraded.Store(false)
		outage := l.now().Sub(time.Unix(0, l.since.Load()))
		l.log.Info("store recovered", "outage", outage.Round(time.Millisecond))
		l.obs.FallbackActive(false)
	default:
		l.log.Debug("circuit breaker state changed", "from", from.String(), "to", to.String())
	}
}

type nopObserver struct{}

func (nopObserver) FallbackActive(bool) {}
func (nopObserver) BreakerState(string) {}
func (nopObserver) StoreError(string)   {}
