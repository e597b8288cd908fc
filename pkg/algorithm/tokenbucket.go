package algorithm

import (
	"math/bits"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// TokenBucket is GCRA: Limit hits per Window milliseconds, at most Burst at
// once (Burst > 0; limiter.Limit.Capacity gives it).
//
// It is the GCRA of COMMON.md with T = W/Limit ms per hit and
// tau = Burst·T, computed exactly: time is counted in ticks of 1/Limit ms,
// so T = W ticks and tau = Burst·W ticks, and the state keeps the
// theoretical arrival time as an integer number of ticks (Debt) after the
// millisecond At. With rel = max(0, Debt − (now−At)·Limit) the debt at now,
// hits c are admitted iff rel + c·W ≤ Burst·W, and then
// rel += c·W and the state becomes {At: now, Debt: rel}. Then
//
//	Remaining  = floor((Burst·W − rel) / W)       (0 if negative)
//	ResetAfter = ceil(rel / Limit) ms             (until full)
//	RetryAfter = ceil((rel + c·W − Burst·W) / Limit) ms  (on denial)
//
// which are the float formulas of COMMON.md (floor((tau − (tat−now))/T),
// ceil(tat−now), ceil(new − tau − now)) without rounding. Products must stay
// below 2^53 for the Lua scripts, which compute in doubles: Burst·W < 2^53
// (a burst of a million per day is 8.6·10^13).
//
// Debt is in units of 1/Per ms; when Limit changes while the counter lives
// (the Limit is not part of the counter's identity), the debt is rescaled
// to the new unit, rounding up: ceil(Debt·Limit/Per).
type TokenBucket struct {
	Limit  uint64
	Burst  uint64
	Window int64 // W in milliseconds
}

// TokenBucketState is the theoretical arrival time At + Debt/Per ms. The
// zero value is a full bucket.
type TokenBucketState struct {
	At   int64  // ms since the epoch of the last update
	Debt uint64 // ticks of 1/Per ms after At
	Per  uint64 // the Limit the Debt was counted with
}

// debt returns the debt at now in ticks of 1/Limit ms.
func (a TokenBucket) debt(s TokenBucketState, now int64) uint64 {
	if s.Debt == 0 {
		return 0
	}
	debt := s.Debt
	if s.Per != a.Limit && s.Per != 0 {
		hi, lo := bits.Mul64(debt, a.Limit)
		if hi >= s.Per {
			return ^uint64(0)
		}
		q, r := bits.Div64(hi, lo, s.Per)
		if r != 0 {
			q++
		}
		debt = q
	}
	if now < s.At {
		hi, add := bits.Mul64(uint64(s.At-now), a.Limit)
		sum, carry := bits.Add64(debt, add, 0)
		if hi != 0 || carry != 0 {
			return ^uint64(0)
		}
		return sum
	}
	hi, paid := bits.Mul64(uint64(now-s.At), a.Limit)
	if hi != 0 || paid >= debt {
		return 0
	}
	return debt - paid
}

// wideDebt is the debt at now, hi·2^64 + lo ticks, of which rel (debt's)
// is the saturated value: a clock behind the state by far enough (a limit
// near 2^53 per ms, a step back of seconds) makes it pass 2^64, which
// decides alike (a denial) but would make the waits too short.
func (a TokenBucket) wideDebt(s TokenBucketState, now int64, rel uint64) (hi, lo uint64) {
	if now >= s.At || rel != ^uint64(0) {
		return 0, rel
	}
	at := a.debt(s, s.At) // rescaled to Limit, as at At
	hi, add := bits.Mul64(uint64(s.At-now), a.Limit)
	lo, carry := bits.Add64(at, add, 0)
	return hi + carry, lo
}

// ceilDiv128 is ceil((hi·2^64 + lo) / b), saturated at 2^64 − 1.
func ceilDiv128(hi, lo, b uint64) uint64 {
	if hi >= b {
		return ^uint64(0)
	}
	q, r := bits.Div64(hi, lo, b)
	if r != 0 && q != ^uint64(0) {
		q++
	}
	return q
}

// Decide applies hits at now to s. See TokenBucket for the arithmetic.
func (a TokenBucket) Decide(s TokenBucketState, now int64, hits uint64) (Decision, TokenBucketState) {
	c, consume := effectiveHits(hits)
	w := uint64(a.Window)
	tau := a.Burst * w
	rel := a.debt(s, now)
	var d Decision
	switch {
	case c > a.Burst:
		d.RetryAfter = limiter.Millis(a.Window)
	case rel <= tau && c*w <= tau-rel:
		d.Allowed = true
		if consume {
			rel += c * w
		}
	default:
		// rel + c·W − tau, with rel as wide as it is.
		hi, lo := a.wideDebt(s, now, rel)
		lo, carry := bits.Add64(lo, c*w, 0)
		lo, borrow := bits.Sub64(lo, tau, 0)
		d.RetryAfter = msU(ceilDiv128(hi+carry-borrow, lo, a.Limit))
	}
	if rel < tau {
		d.Remaining = (tau - rel) / w
	}
	hi, lo := a.wideDebt(s, now, rel)
	d.ResetAfter = msU(ceilDiv128(hi, lo, a.Limit))
	if rel == 0 {
		return d, TokenBucketState{}
	}
	return d, TokenBucketState{At: now, Debt: rel, Per: a.Limit}
}

// expiresAt is the instant the bucket is full again: At + ceil(Debt/Per).
func (s TokenBucketState) expiresAt() int64 {
	if s.Debt == 0 || s.Per == 0 {
		return s.At
	}
	return s.At + int64(ceilDiv(s.Debt, s.Per))
}
