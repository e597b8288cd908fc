package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// Limiter decides a batch of limit checks atomically.
//
// Check decides every Request of one Envoy request together and writes one
// Result per Request into results (len(results) must equal len(reqs)). The
// batch is all-or-nothing: if any non-shadow Request is denied, no Request
// consumes anything. Otherwise every Request whose limit admits its hits
// consumes them. A shadow Request is counted and reported like any other but
// never vetoes the batch.
//
// Check returns an error only when it could not decide at all (the store is
// unavailable, the context ended, a Request is malformed); results are then
// undefined. Errors caused by the store wrap ErrUnavailable.
//
// Implementations are safe for concurrent use.
type Limiter interface {
	Check(ctx context.Context, reqs []Request, results []Result) error
}

// ErrUnavailable reports that the backing store could not decide (connection
// refused, timeout, circuit open, cluster down). Callers test it with
// errors.Is; the fail-soft layer turns it into a fallback decision.
var ErrUnavailable = errors.New("limiter: store unavailable")

// ErrInvalid reports a malformed Request (empty key, zero window, zero limit,
// results slice of the wrong length). It is a programming error of the
// caller, never a consequence of client input that was validated upstream.
var ErrInvalid = errors.New("limiter: invalid request")

// Algorithm selects how a Limit counts. The zero value is SlidingWindow, the
// default of the descriptor configuration.
type Algorithm uint8

// The algorithms of DESIGN.md §5.
const (
	// SlidingWindow keeps two epoch-aligned counters and admits while
	// cur + prev×(W−elapsed)/W + hits ≤ limit (after Cloudflare).
	SlidingWindow Algorithm = iota
	// FixedWindow keeps one counter per epoch-aligned window (the
	// incumbent envoyproxy/ratelimit behaviour).
	FixedWindow
	// TokenBucket is GCRA: one theoretical-arrival timestamp per key,
	// rate Requests per Window, capacity Burst.
	TokenBucket
	// SlidingLog keeps every admitted hit time; exact, for small limits.
	SlidingLog
)

var algorithmNames = [...]string{
	SlidingWindow: "sliding_window",
	FixedWindow:   "fixed_window",
	TokenBucket:   "token_bucket",
	SlidingLog:    "sliding_log",
}

// String returns the configuration name of a, e.g. "sliding_window".
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm returns the Algorithm named s, as written in configuration.
func ParseAlgorithm(s string) (Algorithm, error) {
	for i, n := range algorithmNames {
		if n == s {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want sliding_window, fixed_window, token_bucket or sliding_log)", s)
}

// FailureMode says what to do with a Request when the store is unavailable.
// The zero value is FailFallback.
type FailureMode uint8

const (
	// FailFallback decides with the in-process limiter at this instance's
	// share of the limit.
	FailFallback FailureMode = iota
	// FailAllow admits.
	FailAllow
	// FailDeny denies.
	FailDeny
)

var failureModeNames = [...]string{
	FailFallback: "fallback",
	FailAllow:    "allow",
	FailDeny:     "deny",
}

// String returns the configuration name of m, e.g. "fallback".
func (m FailureMode) String() string {
	if int(m) < len(failureModeNames) {
		return failureModeNames[m]
	}
	return fmt.Sprintf("failure_mode(%d)", uint8(m))
}

// ParseFailureMode returns the FailureMode named s, as written in configuration.
func ParseFailureMode(s string) (FailureMode, error) {
	for i, n := range failureModeNames {
		if n == s {
			return FailureMode(i), nil
		}
	}
	return 0, fmt.Errorf("unknown failure_mode %q (want fallback, allow or deny)", s)
}

// Limit is one rate: Requests per Window, counted by Algorithm.
type Limit struct {
	Algorithm Algorithm
	// Requests is L, the number of hits admitted per Window. It is > 0.
	Requests uint64
	// Window is W. It is > 0 and a whole number of milliseconds.
	Window time.Duration
	// Burst is the token bucket's capacity; 0 means Requests. Other
	// algorithms ignore it.
	Burst uint64
}

// Capacity is the largest number of hits the limit can admit at one instant:
// Burst for a token bucket (Requests when Burst is 0), Requests otherwise.
func (l Limit) Capacity() uint64 {
	if l.Algorithm == TokenBucket && l.Burst > 0 {
		return l.Burst
	}
	return l.Requests
}

// Validate reports whether l can be counted.
func (l Limit) Validate() error {
	switch {
	case l.Requests == 0:
		return fmt.Errorf("%w: limit of 0 requests", ErrInvalid)
	case l.Window <= 0:
		return fmt.Errorf("%w: window %v is not positive", ErrInvalid, l.Window)
	case l.Window%time.Millisecond != 0:
		return fmt.Errorf("%w: window %v is not a whole number of milliseconds", ErrInvalid, l.Window)
	case int(l.Algorithm) >= len(algorithmNames):
		return fmt.Errorf("%w: %v", ErrInvalid, l.Algorithm)
	}
	return nil
}

// The exact range. Redis's Lua numbers are IEEE doubles, which hold every
// integer below 2^53; a limit is counted exactly when every quantity its
// algorithm stores stays below that. The configuration refuses limits
// outside the range (ExactRange), so a file that loads counts alike on
// every backend; a backend may refuse them with ErrInvalid.
const (
	// MaxExact is 2^53−1, the largest integer a double holds with every
	// integer below it.
	MaxExact = 1<<53 - 1
	// MaxWindowRequests caps the Requests of a sliding or fixed window,
	// 2^51−1: a count, the previous window's weight and the hits, each at
	// most 2^51, add up below 2^53 whatever the window.
	MaxWindowRequests = 1<<51 - 1
)

// ExactRange returns why l is outside the exact range, or nil (the error
// does not wrap ErrInvalid: the configuration reports it as it stands): a sliding or
// fixed window of more than MaxWindowRequests, or a token bucket or sliding
// log whose Requests (or Capacity) × Window in ms exceeds MaxExact. Those
// two count time in ticks of 1/Requests ms.
func (l Limit) ExactRange() error {
	switch l.Algorithm {
	case SlidingWindow, FixedWindow:
		if l.Requests > MaxWindowRequests {
			return fmt.Errorf("%d requests per window is more than %s counts exactly (%d, 2^51−1)",
				l.Requests, l.Algorithm, uint64(MaxWindowRequests))
		}
	default:
		ms := uint64(l.Window / time.Millisecond)
		if x := max(l.Requests, l.Capacity()); ms > 0 && x > MaxExact/ms {
			what := "requests"
			if l.Algorithm == TokenBucket && x == l.Capacity() {
				what = "burst" // Requests when Burst is 0
			}
			return fmt.Errorf("%s %s %d × window %dms exceeds %d, the largest integer Redis's Lua numbers hold exactly: lower the %s or shorten the window",
				l.Algorithm, what, x, ms, uint64(MaxExact), what)
		}
	}
	return nil
}

// Request is one limit to check within a batch.
type Request struct {
	// Key identifies the counter. It is the length-prefixed encoding of
	// the domain, the limit's identity and the request's entries, built
	// with AppendKeyPart; backends add the Limit's algorithm and window
	// when they derive storage keys, so changing a rule's window starts a
	// fresh counter.
	Key   string
	Limit Limit
	// Hits is how many units this request consumes. 0 checks whether one
	// more hit would be admitted, without consuming anything.
	Hits uint64
	// Shadow requests are counted and reported but never veto the batch.
	Shadow bool
	// FailureMode applies when the store cannot decide; only the
	// fail-soft layer reads it.
	FailureMode FailureMode
}

// Source says who decided a Result.
type Source uint8

const (
	// SourceStore: the primary store decided.
	SourceStore Source = iota
	// SourceFallback: the in-process fallback limiter decided at this
	// instance's share of the limit, because the store was unavailable.
	SourceFallback
	// SourceFailAllow: the store was unavailable and the rule's
	// failure_mode is allow.
	SourceFailAllow
	// SourceFailDeny: the store was unavailable and the rule's
	// failure_mode is deny.
	SourceFailDeny
)

var sourceNames = [...]string{
	SourceStore:     "store",
	SourceFallback:  "fallback",
	SourceFailAllow: "failure_mode_allow",
	SourceFailDeny:  "failure_mode_deny",
}

// String returns a short name of s for logs, metrics and metadata.
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return fmt.Sprintf("source(%d)", uint8(s))
}

// Result is the decision on one Request.
type Result struct {
	// Allowed reports whether this limit alone admits the request's hits
	// (for Hits == 0: whether it would admit one hit). The batch consumed
	// iff every non-shadow Result is Allowed.
	Allowed bool
	// Remaining is how many more hits could be admitted now, after this
	// batch's consumption if the batch consumed.
	Remaining uint64
	// ResetAfter is the time until the current window ends (fixed and
	// sliding windows, sliding log) or until the bucket is full again
	// (token bucket).
	ResetAfter time.Duration
	// RetryAfter is 0 when Allowed; otherwise the exact time after which
	// the same hits would be admitted if nothing else arrived.
	RetryAfter time.Duration
	// Source says who decided.
	Source Source
}

// AppendKeyPart appends s to dst with an unambiguous length prefix (a
// uvarint byte count), so that a sequence of parts encodes to a unique byte
// string: ("ab","c") and ("a","bc") never collide, and no byte inside a part
// can be mistaken for a separator.
func AppendKeyPart(dst []byte, s string) []byte {
	n := uint64(len(s))
	for n >= 0x80 {
		dst = append(dst, byte(n)|0x80)
		n >>= 7
	}
	dst = append(dst, byte(n))
	return append(dst, s...)
}

// Millis converts ms milliseconds to a Duration, saturating at the largest
// one (292 years) instead of wrapping to a negative one: a window of
// centuries, or a token bucket of 1 a year with a burst of 10,000, has waits
// that long.
func Millis(ms int64) time.Duration {
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}
