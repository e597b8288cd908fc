package algorithm

import (
	"math"
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// Decision is the outcome of one request against one counter.
type Decision struct {
	// Allowed reports whether the hits were (or, for hits == 0, one hit
	// would be) admitted.
	Allowed bool
	// Remaining is how many more hits could be admitted at now, on the
	// state returned with the Decision.
	Remaining uint64
	// ResetAfter is the time until the current bucket ends (fixed and
	// sliding windows), until the oldest logged hit leaves the window
	// (sliding log; the window when the log is empty), or until the
	// bucket is full again (token bucket).
	ResetAfter time.Duration
	// RetryAfter is 0 when Allowed, else the exact wait before the same
	// hits would be admitted if nothing else arrived.
	RetryAfter time.Duration
}

// State is the stored state of one counter of any algorithm; only the field
// of the counter's algorithm is used. The zero State is an absent counter.
type State struct {
	SlidingWindow SlidingWindowState
	FixedWindow   FixedWindowState
	TokenBucket   TokenBucketState
	SlidingLog    SlidingLogState
}

// Decide applies hits at now (ms since the epoch) to the counter s of limit
// l and returns the decision and the counter's new state. The new state
// equals s in meaning when nothing was consumed. l must be valid
// (l.Validate() == nil). Decide never modifies s (the new state may share
// memory with it), so s may be decided on again.
func Decide(l limiter.Limit, s State, now int64, hits uint64) (Decision, State) {
	return decide(l, s, now, hits, false)
}

// DecideOwned is Decide for the one owner of s and of every state decided
// from it, which keeps of them only the state it decides on next: a store
// that holds one state per counter under a lock, as the memory backend
// does. It decides as Decide does, but a sliding log's consuming decision
// appends in place instead of copying the log when its array has room (see
// Reserve and SlidingLog.decide), which invalidates the states
// decided before that see a later batch. It must not run concurrently with
// any decision on s or a state sharing its memory.
func DecideOwned(l limiter.Limit, s State, now int64, hits uint64) (Decision, State) {
	return decide(l, s, now, hits, true)
}

// Reserve returns s, or a copy of it equal in meaning at every instant and
// true, on which n consuming DecideOwned decisions in a row append in
// place: a sliding log whose array is full, or holds more batches that
// earlier decisions trimmed than live ones, is copied with room to grow
// (doubling). An owner calls it on the state it stores before deciding on
// it, and stores the copy even when it then keeps nothing decided: the log
// of a counter whose requests another limit keeps vetoing is then copied
// once, not at every request. Other algorithms' states are returned as is.
func Reserve(l limiter.Limit, s State, n int) (State, bool) {
	if l.Algorithm != limiter.SlidingLog {
		return s, false
	}
	var copied bool
	s.SlidingLog, copied = s.SlidingLog.reserved(n)
	return s, copied
}

func decide(l limiter.Limit, s State, now int64, hits uint64, owned bool) (Decision, State) {
	w := l.Window.Milliseconds()
	var d Decision
	switch l.Algorithm {
	case limiter.FixedWindow:
		d, s.FixedWindow = FixedWindow{Limit: l.Requests, Window: w}.Decide(s.FixedWindow, now, hits)
	case limiter.TokenBucket:
		d, s.TokenBucket = TokenBucket{Limit: l.Requests, Burst: l.Capacity(), Window: w}.Decide(s.TokenBucket, now, hits)
	case limiter.SlidingLog:
		d, s.SlidingLog = SlidingLog{Limit: l.Requests, Window: w}.decide(s.SlidingLog, now, hits, owned)
	default:
		d, s.SlidingWindow = SlidingWindow{Limit: l.Requests, Window: w}.Decide(s.SlidingWindow, now, hits)
	}
	return d, s
}

// ExpiresAt returns the instant (ms since the epoch) from which s is
// equivalent to the zero State for limit l, so a store may forget it. It is
// the expiry the Redis scripts give their keys.
func ExpiresAt(l limiter.Limit, s State) int64 {
	w := l.Window.Milliseconds()
	switch l.Algorithm {
	case limiter.FixedWindow:
		return (s.FixedWindow.Bucket + 1) * w
	case limiter.TokenBucket:
		return s.TokenBucket.expiresAt()
	case limiter.SlidingLog:
		return s.SlidingLog.expiresAt(w)
	default:
		return (s.SlidingWindow.Bucket + 2) * w
	}
}

// floorDiv returns floor(a/b) for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// behind returns how far now is before the start of bucket (of window w
// ms): positive when a counter's state is of a later bucket than now's,
// because the clock went back across a bucket edge since it was written
// (an NTP step, a failover to a server whose clock is behind). The windows
// then decide at the start of the stored bucket, where its counts weigh
// most, rather than take the state for empty: a clock that steps back never
// makes a counter forget what it counted. Reset and retry times are then
// longer by that much, so that they still hold from the actual now.
func behind(bucket, now, w int64) int64 {
	return max(0, bucket*w-now)
}

// ceilDiv returns ceil(a/b) for b > 0.
func ceilDiv(a, b uint64) uint64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

// msU is limiter.Millis of an unsigned count.
func msU(v uint64) time.Duration {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return limiter.Millis(int64(v))
}

// plusMs returns d + v ms for d, v >= 0, saturating like limiter.Millis.
func plusMs(d time.Duration, v int64) time.Duration {
	if e := limiter.Millis(v); d <= math.MaxInt64-e {
		return d + e
	}
	return math.MaxInt64
}

// effectiveHits returns the number of hits to decide for (1 for a check
// without consumption) and whether to consume.
func effectiveHits(hits uint64) (c uint64, consume bool) {
	if hits == 0 {
		return 1, false
	}
	return hits, true
}
