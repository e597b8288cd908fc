package algorithm

import (
	"math/bits"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// SlidingWindow is the two-counter sliding window (after Cloudflare): Limit
// hits per Window milliseconds (both > 0), buckets aligned to the epoch.
//
// At now, b = floor(now/W), elapsed = now − b·W, cur = count[b],
// prev = count[b−1] and the weight of the previous bucket is
//
//	pw = ceil(prev·(W−elapsed)/W)
//
// exactly, in integers (the Lua script computes it in doubles while prev·W <
// 2^53, where multiply, divide and ceil are exact, and by long division
// beyond: a monthly limit of millions reaches that).
// Hits c are admitted iff cur + pw + c ≤ Limit, and then cur += c.
//
// Bound: the estimate never admits more than Limit in one aligned bucket,
// but it is not exact. In any half-open interval (t−W, t] of length W ≥ 2 it
// admits at most
//
//	2·Limit − ceil(2·Limit / W)
//
// hits, and this is attained (Limit hits at the last millisecond of a
// bucket, then Limit − ceil(2·Limit/W) hits two milliseconds before the end
// of the next one). Proof: the interval spans the end of bucket b−1 (hits x
// at elapsed > e, where e is t's elapsed in bucket b) and the start of
// bucket b (hits y). With P = count[b−1] ≤ Limit, the last admission in b
// happened at an elapsed e' ≤ e, so y ≤ Limit − ceil(P·(W−e')/W) ≤
// Limit − ceil(P·(W−e)/W), and x ≤ P, so x + y ≤ Limit + floor(P·e/W); if
// e = W−1 then x = 0 (no millisecond of b−1 is later than e), so e ≤ W−2
// and P ≤ Limit give the bound. For W = 1 ms the interval is one bucket and
// the bound is Limit.
type SlidingWindow struct {
	Limit  uint64
	Window int64 // W in milliseconds
}

// SlidingWindowState holds count[Bucket] = Cur and count[Bucket−1] = Prev.
// The zero value is an empty counter.
type SlidingWindowState struct {
	Bucket    int64
	Cur, Prev uint64
}

// counts returns the bucket of now and the counts of it and the bucket
// before, as seen from state s.
func (a SlidingWindow) counts(s SlidingWindowState, now int64) (b int64, cur, prev uint64) {
	b = floorDiv(now, a.Window)
	switch s.Bucket {
	case b:
		return b, s.Cur, s.Prev
	case b - 1:
		return b, 0, s.Cur
	}
	return b, 0, 0
}

// weight is ceil(prev·(W−elapsed)/W) = prev − floor(prev·elapsed/W), in
// 128-bit integers: prev·elapsed can exceed 2^64 (a limit of billions a
// year).
func (a SlidingWindow) weight(prev uint64, elapsed int64) uint64 {
	if prev == 0 || elapsed == 0 {
		return prev
	}
	return prev - mulDiv(prev, uint64(elapsed), uint64(a.Window))
}

// mulDiv returns floor(x·y/m) for x·y/m < 2^64 (e.g. y < m), with m > 0.
func mulDiv(x, y, m uint64) uint64 {
	hi, lo := bits.Mul64(x, y)
	q, _ := bits.Div64(hi, lo, m)
	return q
}

// admits is the admission predicate at now on counts (b, cur, prev) of the
// bucket b ≤ floor(now/W): cur + pw + c ≤ Limit.
func (a SlidingWindow) admits(b int64, cur, prev uint64, now int64, c uint64) bool {
	bn := floorDiv(now, a.Window)
	switch {
	case bn == b+1:
		cur, prev = 0, cur
	case bn > b+1:
		cur, prev = 0, 0
	}
	pw := a.weight(prev, now-bn*a.Window)
	return cur+pw+c <= a.Limit
}

// Decide applies hits at now to s. See SlidingWindow for the arithmetic; a
// state of a later bucket than now's is decided at that bucket's start (see
// behind).
func (a SlidingWindow) Decide(s SlidingWindowState, now int64, hits uint64) (Decision, SlidingWindowState) {
	c, consume := effectiveHits(hits)
	step := behind(s.Bucket, now, a.Window)
	now += step
	b, cur, prev := a.counts(s, now)
	pw := a.weight(prev, now-b*a.Window)
	d := Decision{ResetAfter: limiter.Millis((b+1)*a.Window - now)}
	switch {
	case c > a.Limit:
		d.RetryAfter = limiter.Millis(a.Window)
	case cur+pw+c <= a.Limit:
		d.Allowed = true
		if consume {
			cur += c
		}
	default:
		d.RetryAfter = limiter.Millis(a.retryAt(b, cur, prev, now, c) - now)
	}
	if used := cur + pw; used < a.Limit {
		d.Remaining = a.Limit - used
	}
	d.ResetAfter = plusMs(d.ResetAfter, step)
	if d.RetryAfter > 0 {
		d.RetryAfter = plusMs(d.RetryAfter, step)
	}
	return d, SlidingWindowState{Bucket: b, Cur: cur, Prev: prev}
}

// retryAt returns the earliest instant t > now at which admits holds for
// the unchanged counts of bucket b. The predicate is monotone in t (the
// estimate never grows without hits), true from bucket b+2 on (c ≤ Limit),
// so the analytic estimate is corrected by stepping with the predicate.
func (a SlidingWindow) retryAt(b int64, cur, prev uint64, now int64, c uint64) int64 {
	w := a.Window
	t := (b + 2) * w
	// Earliest elapsed e in a bucket with counts (cu, pr) so that
	// ceil(pr·(W−e)/W) ≤ r, i.e. e ≥ W − floor(r·W/pr).
	earliest := func(pr, r uint64) int64 {
		if pr == 0 || r >= pr {
			return 0
		}
		return w - int64(mulDiv(r, uint64(w), pr)) // r < pr: below W
	}
	inThis := false
	if cur+c <= a.Limit {
		if e := earliest(prev, a.Limit-cur-c); e < w {
			t, inThis = b*w+max(e, 0), true
		}
	}
	if !inThis {
		if e := earliest(cur, a.Limit-c); e < w {
			t = (b+1)*w + max(e, 0)
		}
	}
	t = max(t, now+1)
	for t > now+1 && a.admits(b, cur, prev, t-1, c) {
		t--
	}
	for !a.admits(b, cur, prev, t, c) {
		t++
	}
	return t
}
