package rls

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
)

// DenyObserver is an optional extension of Observer. When Options.Observer
// also implements it, ObserveDeny is called right after ObserveDecision for
// every limit whose outcome is OutcomeOverLimit or OutcomeShadowOverLimit,
// with the entries of the request descriptor that was denied: the one place
// where descriptor values (client input, unbounded) reach an Observer, for
// bounded summaries such as the heavy hitters of /debug/top. It is never
// called for admitted requests, so the OK path pays nothing for it.
//
// entries is valid only during the call: copy what is kept. ObserveDeny is
// called on the request path, synchronously, and must be fast and safe for
// concurrent use.
type DenyObserver interface {
	ObserveDeny(d Decision, entries []descriptors.Entry)
}

// observeDeny reports limiter result k, a denial observed as d, to the
// Observer's DenyObserver side, if it has one.
func (s *Service) observeDeny(req *rlsv3.RateLimitRequest, sc *scratch, d Decision, k int) {
	do, ok := s.obs.(DenyObserver)
	if !ok {
		return
	}
	// sc.entries is free once plan is done; reusing it keeps a deny
	// allocation-free too.
	sc.entries = sc.entries[:0]
	for _, e := range req.Descriptors[sc.meta[k].desc].Entries {
		sc.entries = append(sc.entries, descriptors.Entry{Key: e.Key, Value: e.Value})
	}
	do.ObserveDeny(d, sc.entries)
}
