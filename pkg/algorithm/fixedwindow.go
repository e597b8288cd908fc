package algorithm

import "github.com/envoy-rls/envoy-rls/pkg/limiter"

// FixedWindow counts hits per epoch-aligned bucket of Window milliseconds:
// b = floor(now/W); hits c are admitted iff count[b] + c ≤ Limit. It may
// admit 2·Limit hits within W milliseconds across a bucket edge (the
// incumbent's behaviour, kept for migration).
type FixedWindow struct {
	Limit  uint64
	Window int64 // W in milliseconds
}

// FixedWindowState holds count[Bucket] = Count. The zero value is an empty
// counter.
type FixedWindowState struct {
	Bucket int64
	Count  uint64
}

// Decide applies hits at now to s. RetryAfter of a denial is the time until
// the bucket ends. A state of a later bucket than now's is decided at that
// bucket's start (see behind).
func (a FixedWindow) Decide(s FixedWindowState, now int64, hits uint64) (Decision, FixedWindowState) {
	c, consume := effectiveHits(hits)
	step := behind(s.Bucket, now, a.Window)
	now += step
	b := floorDiv(now, a.Window)
	var n uint64
	if s.Bucket == b {
		n = s.Count
	}
	d := Decision{ResetAfter: limiter.Millis((b+1)*a.Window - now)}
	switch {
	case c > a.Limit:
		d.RetryAfter = limiter.Millis(a.Window)
	case n+c <= a.Limit:
		d.Allowed = true
		if consume {
			n += c
		}
	default:
		d.RetryAfter = d.ResetAfter
	}
	if n < a.Limit {
		d.Remaining = a.Limit - n
	}
	d.ResetAfter = plusMs(d.ResetAfter, step)
	if d.RetryAfter > 0 {
		d.RetryAfter = plusMs(d.RetryAfter, step)
	}
	return d, FixedWindowState{Bucket: b, Count: n}
}
