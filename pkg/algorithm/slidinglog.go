package algorithm

import "github.com/envoy-rls/envoy-rls/pkg/limiter"

// SlidingLog keeps the time of every admitted hit and admits hits c at now
// iff n + c ≤ Limit, where n is the number of logged hits later than
// now − Window (so in (now−W, now] when the clock does not go back; hits
// logged in the future of now also count, as they would in a Redis sorted
// set trimmed with ZREMRANGEBYSCORE -inf now−W). Hits are logged at
// max(now, the newest entry's time): after a clock step back they are
// logged at the newest time and count at least as long as they would at
// now, never shorter, and the log's times never decrease (the Redis
// backend's running totals rely on it). It is exact: in every half-open
// interval of length W at most Limit hits are admitted. Limits are small
// (descriptor validation caps them at 10000).
type SlidingLog struct {
	Limit  uint64
	Window int64 // W in milliseconds
}

// LogEntry records N hits admitted at millisecond At.
type LogEntry struct {
	At int64
	N  uint64
}

// SlidingLogState is the log of admitted hits, oldest first. The zero value
// is an empty log.
type SlidingLogState struct {
	Entries []LogEntry
}

// Decide applies hits at now to s. Entries that left the window are dropped
// from the returned state.
//
// Decide never modifies s: a consuming decision returns a new slice (one
// allocation), so any earlier state stays valid and may be decided on
// again. Hits logged at the newest entry's time are merged into it.
func (a SlidingLog) Decide(s SlidingLogState, now int64, hits uint64) (Decision, SlidingLogState) {
	c, consume := effectiveHits(hits)
	cutoff := now - a.Window
	live := s.Entries
	for len(live) > 0 && live[0].At <= cutoff {
		live = live[1:]
	}
	if len(live) == 0 {
		live = nil
	}
	var n uint64
	for _, e := range live {
		n += e.N
	}
	var d Decision
	switch {
	case c > a.Limit:
		d.RetryAfter = limiter.Millis(a.Window)
	case n+c <= a.Limit:
		d.Allowed = true
		if consume {
			live = insert(live, LogEntry{At: now, N: c})
			n += c
		}
	default:
		// Enough entries must leave: the k-th oldest hit, k = n+c−Limit.
		k := n + c - a.Limit
		var seen uint64
		for _, e := range live {
			if seen += e.N; seen >= k {
				d.RetryAfter = limiter.Millis(e.At + a.Window - now)
				break
			}
		}
	}
	if n < a.Limit {
		d.Remaining = a.Limit - n
	}
	d.ResetAfter = limiter.Millis(a.Window)
	if len(live) > 0 {
		d.ResetAfter = limiter.Millis(live[0].At + a.Window - now)
	}
	return d, SlidingLogState{Entries: live}
}

// expiresAt is the instant the newest entry leaves the window.
func (s SlidingLogState) expiresAt(w int64) int64 {
	if len(s.Entries) == 0 {
		return w
	}
	return s.Entries[len(s.Entries)-1].At + w
}

// insert returns a copy of the log with e appended at max(e.At, the newest
// entry's time), merged into the newest entry when that is its time.
func insert(log []LogEntry, e LogEntry) []LogEntry {
	if n := len(log); n > 0 && log[n-1].At >= e.At {
		out := append([]LogEntry(nil), log...)
		out[n-1].N += e.N
		return out
	}
	out := make([]LogEntry, 0, len(log)+1)
	out = append(out, log...)
	return append(out, e)
}
