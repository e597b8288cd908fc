package algorithm

import (
	"sort"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// SlidingLog keeps the time of every admitted hit and admits hits c at now
// iff n + c ≤ Limit, where n is the number of logged hits later than
// now − Window (so in (now−W, now] when the clock does not go back; hits
// logged in the future of now also count, as they would in a Redis sorted
// set trimmed with ZREMRANGEBYSCORE -inf now−W). Hits are logged at
// max(now, the newest batch's time): after a clock step back they are
// logged at the newest time and count at least as long as they would at
// now, never shorter, and the log's times never decrease (the Redis
// backend's running totals rely on it). It is exact: in every half-open
// interval of length W at most Limit hits are admitted. Limits are small
// (descriptor validation caps them at 10000; Decide needs Limit < 2^62).
type SlidingLog struct {
	Limit  uint64
	Window int64 // W in milliseconds
}

// SlidingLogState is the log of admitted batches (the hits of one
// consuming decision each), oldest first. The zero value is an empty log.
//
// Its batches are b[lo:], a view of an array that the states decided from
// one another share: a decision trims the view in O(log n) and counts it in
// O(1) (each batch carries the running total of the hits before it, as the
// Redis backend's members do), and DecideOwned (algorithm.go) appends to
// the array in place.
type SlidingLogState struct {
	b  []batch
	lo int
}

// batch is the hits of one consuming decision.
type batch struct {
	at     int64  // ms the hits are logged at
	before uint64 // the log's hits before this batch (its running total)
	n      uint64 // hits
}

// renumberAbove bounds a log's running totals: an append that would take
// them past it copies the log, numbered from 0. With Limit < 2^62 the
// totals never overflow.
const renumberAbove = 1 << 62

// Decide applies hits at now to s. Batches that left the window are
// dropped from the returned state.
//
// Decide never writes memory that any state sees: a consuming decision
// returns a copy of the live batches plus its own, so any earlier state
// stays valid and may be decided on again, concurrently too.
func (a SlidingLog) Decide(s SlidingLogState, now int64, hits uint64) (Decision, SlidingLogState) {
	return a.decide(s, now, hits, false)
}

// decide is Decide, or with owned DecideOwned (the package's dispatcher,
// algorithm.go): for the one owner of s and of every state decided from
// it, which keeps of them only the state it decides on next (a store under
// its lock), a consuming decision appends its batch to s's array in place
// when the array has room (see Reserve), where Decide copies the whole
// live log. So it invalidates every state that sees a batch appended after
// s's: those decided owned from s before, and those decided from them
// without consuming. It must not run concurrently with any decision on a
// state sharing s's array.
func (a SlidingLog) decide(s SlidingLogState, now int64, hits uint64, owned bool) (Decision, SlidingLogState) {
	c, consume := effectiveHits(hits)
	live := s.trimmed(now - a.Window)
	n := live.hits()
	var d Decision
	switch {
	case c > a.Limit:
		d.RetryAfter = limiter.Millis(a.Window)
	case n+c <= a.Limit:
		d.Allowed = true
		if consume {
			live = live.appended(now, c, owned)
			n += c
		}
	default:
		// Enough hits must leave: the k-th oldest, k = n+c−Limit, is in
		// the first batch whose running total reaches start + k. (The
		// clamp only matters for limits beyond 2^62, where sums wrap.)
		b := live.b[live.lo:]
		target := b[0].before + n + c - a.Limit
		i := sort.Search(len(b), func(i int) bool { return b[i].before+b[i].n >= target })
		d.RetryAfter = limiter.Millis(b[min(i, len(b)-1)].at + a.Window - now)
	}
	if n < a.Limit {
		d.Remaining = a.Limit - n
	}
	d.ResetAfter = limiter.Millis(a.Window)
	if live.lo < len(live.b) {
		d.ResetAfter = limiter.Millis(live.b[live.lo].at + a.Window - now)
	}
	return d, live
}

// trimmed returns s without the batches logged at or before cutoff.
func (s SlidingLogState) trimmed(cutoff int64) SlidingLogState {
	b := s.b[s.lo:]
	s.lo += sort.Search(len(b), func(i int) bool { return b[i].at > cutoff })
	return s
}

// hits returns the number of hits in s.
func (s SlidingLogState) hits() uint64 {
	if s.lo == len(s.b) {
		return 0
	}
	first, last := s.b[s.lo], s.b[len(s.b)-1]
	return last.before + last.n - first.before
}

// appended returns s with c hits logged at max(now, the newest batch's
// time). Owned, it writes the batch at the end of s's array when the array
// has room, after the batches that left the window if any (Reserve drops
// them); otherwise, and always when not owned, it copies s's live batches
// to a new array, numbered from 0.
func (s SlidingLogState) appended(now int64, c uint64, owned bool) SlidingLogState {
	var before uint64
	if k := len(s.b); k > 0 {
		// The newest batch, live or not: a batch that left the window is
		// older than now, and the totals go on from it.
		last := s.b[k-1]
		now = max(now, last.at)
		before = last.before + last.n
	}
	if owned && len(s.b) < cap(s.b) && before <= renumberAbove && c <= renumberAbove-before {
		s.b = append(s.b, batch{at: now, before: before, n: c}) // in place: len < cap
		return s
	}
	room := 1
	if owned {
		room = len(s.b) - s.lo + 4 // doubling as the log grows
	}
	s = s.copied(room)
	before = 0
	if k := len(s.b); k > 0 {
		before = s.b[k-1].before + s.b[k-1].n
	}
	s.b = append(s.b, batch{at: now, before: before, n: c})
	return s
}

// copied returns s's batches in a new array with room for extra more,
// their running totals numbered from 0.
func (s SlidingLogState) copied(extra int) SlidingLogState {
	live := s.b[s.lo:]
	b := make([]batch, len(live), len(live)+extra)
	copy(b, live)
	if len(b) > 0 {
		base := b[0].before
		for i := range b {
			b[i].before -= base
		}
	}
	return SlidingLogState{b: b}
}

// reserved returns s, or a copy of it and true, whose array has room for n
// appends in place and holds no more batches before s's than in it. A log
// that stops changing (its requests vetoed by another limit) so keeps its
// room: copying on the append itself would copy again at every veto.
func (s SlidingLogState) reserved(n int) (SlidingLogState, bool) {
	live := len(s.b) - s.lo
	switch {
	case live == 0:
		return SlidingLogState{}, s.b != nil // empty: the first append allocates
	case cap(s.b)-len(s.b) >= n && s.lo <= live:
		return s, false
	}
	return s.copied(live + n + 4), true
}

// expiresAt is the instant the newest batch leaves the window.
func (s SlidingLogState) expiresAt(w int64) int64 {
	if s.lo == len(s.b) {
		return w
	}
	return s.b[len(s.b)-1].at + w
}
