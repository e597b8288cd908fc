package limitertest

import (
	"time"

	"github.com/envoy-rls/envoy-rls/pkg/algorithm"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// ident is the storage identity of a counter.
type ident struct {
	key    string
	alg    limiter.Algorithm
	window time.Duration
}

func identOf(r limiter.Request) ident {
	return ident{key: r.Key, alg: r.Limit.Algorithm, window: r.Limit.Window}
}

// Model is the reference store: pkg/algorithm with the batch semantics of
// the package documentation, written as plainly as possible. Tests of
// limiters that wrap others (the fail-soft layer) compare against it too.
// Not safe for concurrent use.
type Model struct {
	states map[ident]algorithm.State
}

// NewModel returns an empty Model.
func NewModel() *Model { return &Model{states: make(map[ident]algorithm.State)} }

// Check decides a batch of valid requests at now (ms) and returns the
// results (Source SourceStore) and whether the batch consumed. vetoed
// decides the batch as denied whatever its requests' own decisions, as when
// a request outside it (a deny-mode rule in the fail-soft layer) vetoed it.
func (m *Model) Check(now int64, reqs []limiter.Request, vetoed bool) ([]limiter.Result, bool) {
	res := make([]limiter.Result, len(reqs))
	tent := make(map[ident]algorithm.State)
	ok := !vetoed
	for i, r := range reqs {
		id := identOf(r)
		s, seen := tent[id]
		if !seen {
			s = m.states[id]
		}
		d, ns := algorithm.Decide(r.Limit, s, now, r.Hits)
		res[i] = limiter.Result{Allowed: d.Allowed, Remaining: d.Remaining, ResetAfter: d.ResetAfter,
			RetryAfter: d.RetryAfter, Source: limiter.SourceStore}
		if d.Allowed && r.Hits > 0 {
			tent[id] = ns
		} else {
			tent[id] = s
		}
		if !d.Allowed && !r.Shadow {
			ok = false
		}
	}
	if ok {
		for id, s := range tent {
			m.states[id] = s
		}
		return res, true
	}
	for i, r := range reqs {
		d, _ := algorithm.Decide(r.Limit, m.states[identOf(r)], now, 0)
		res[i].Remaining, res[i].ResetAfter = d.Remaining, d.ResetAfter
	}
	return res, false
}
