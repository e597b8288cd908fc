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
// It is a view, [lo, hi), of a log that the states decided from one
// another share: a decision trims the view in O(log n) and counts it in
// O(1) (each batch carries the running total of the hits before it, as the
// Redis backend's members do), and DecideOwned appends to it in place.
type SlidingLogState struct {
	log    *hitLog
	lo, hi int
}

// hitLog is the memory SlidingLogStates share. Its batches' times never
// decrease and their running totals increase by each batch's hits.
type hitLog struct {
	b []batch
}

// batch is the hits of one consuming decision.
type batch struct {
	at     int64  // ms the hits are logged at
	before uint64 // the log's hits before this batch (its running total)
	n      uint64 // hits
}

// renumberAbove bounds a log's running totals: an append that would take
// them past it starts a new log, numbered from 0. With Limit < 2^62 the
// totals never overflow.
const renumberAbove = 1 << 62

// Decide applies hits at now to s. Batches that left the window are
// dropped from the returned state.
//
// Decide never modifies s: a consuming decision copies the live batches
// (one allocation), so any earlier state stays valid and may be decided on
// again, concurrently too.
func (a SlidingLog) Decide(s SlidingLogState, now int64, hits uint64) (Decision, SlidingLogState) {
	return a.decide(s, now, hits, false)
}

// DecideOwned is Decide for the one owner of s and of every state decided
// from it, which keeps of them only the state it decides on next (a store
// under its lock): a consuming decision appends to the shared log in place,
// amortised O(1) where Decide copies the whole live log. It invalidates
// every state DecideOwned decided from s before (states Decide returned are
// copies and stay valid), and must not run concurrently with any decision
// on a state sharing s's log.
func (a SlidingLog) DecideOwned(s SlidingLogState, now int64, hits uint64) (Decision, SlidingLogState) {
	return a.decide(s, now, hits, true)
}

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
		// the first batch whose running total passes start + k − 1.
		b := live.log.b
		target := b[live.lo].before + n + c - a.Limit
		i := live.lo + sort.Search(live.hi-live.lo, func(i int) bool {
			e := b[live.lo+i]
			return e.before+e.n >= target
		})
		d.RetryAfter = limiter.Millis(b[i].at + a.Window - now)
	}
	if n < a.Limit {
		d.Remaining = a.Limit - n
	}
	d.ResetAfter = limiter.Millis(a.Window)
	if live.lo < live.hi {
		d.ResetAfter = limiter.Millis(live.log.b[live.lo].at + a.Window - now)
	}
	return d, live
}

// trimmed returns s without the batches logged at or before cutoff.
func (s SlidingLogState) trimmed(cutoff int64) SlidingLogState {
	if s.lo == s.hi {
		return s
	}
	b := s.log.b
	s.lo += sort.Search(s.hi-s.lo, func(i int) bool { return b[s.lo+i].at > cutoff })
	return s
}

// hits returns the number of hits in s.
func (s SlidingLogState) hits() uint64 {
	if s.lo == s.hi {
		return 0
	}
	first, last := s.log.b[s.lo], s.log.b[s.hi-1]
	return last.before + last.n - first.before
}

// appended returns s with c hits logged at max(now, the newest batch's
// time). Owned, it writes the batch after s in s's log, over whatever
// states decided from s before wrote there, unless the log is full or
// mostly batches that left the window; otherwise, and always when not
// owned, it copies s's batches to a new log, numbered from 0.
func (s SlidingLogState) appended(now int64, c uint64, owned bool) SlidingLogState {
	var before uint64
	if s.lo < s.hi {
		last := s.log.b[s.hi-1]
		now = max(now, last.at)
		before = last.before + last.n
	}
	if owned && s.log != nil && s.hi < cap(s.log.b) && s.lo <= s.hi-s.lo && before <= renumberAbove-c {
		s.log.b = append(s.log.b[:s.hi], batch{at: now, before: before, n: c})
		s.hi++
		return s
	}
	live := s.hi - s.lo
	size := live + 1
	if owned {
		size = 2*live + 4 // room to append in place, doubling as the log grows
	}
	l := &hitLog{b: make([]batch, live, size)}
	if live > 0 {
		copy(l.b, s.log.b[s.lo:s.hi])
		base := l.b[0].before
		for i := range l.b {
			l.b[i].before -= base
		}
		before -= base
	}
	l.b = append(l.b, batch{at: now, before: before, n: c})
	return SlidingLogState{log: l, lo: 0, hi: live + 1}
}

// expiresAt is the instant the newest batch leaves the window.
func (s SlidingLogState) expiresAt(w int64) int64 {
	if s.lo == s.hi {
		return w
	}
	return s.log.b[s.hi-1].at + w
}
