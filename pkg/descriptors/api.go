package descriptors

import (
	"fmt"

	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// Position is a place in a configuration file.
type Position struct {
	File   string
	Line   int
	Column int
}

// String formats p as file:line:col, leaving out the column when it is
// unknown (0) and the line too when that is unknown.
func (p Position) String() string {
	switch {
	case p.Line <= 0:
		return p.File
	case p.Column <= 0:
		return fmt.Sprintf("%s:%d", p.File, p.Line)
	}
	return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Column)
}

// Entry is one key/value pair of a request descriptor.
type Entry struct {
	Key   string
	Value string
}

// Limit is one compiled limit of a Rule.
type Limit struct {
	// ID is the stable identity of this limit, used in storage keys: the
	// rule's ID, followed by "#<index>" (0-based position in rate_limits)
	// when the rule has several limits, e.g. "tenant.user#1" for the second.
	ID string
	// Name is the configured rate_limit name, or the rule's Name.
	Name string
	// Named: Name was configured, not taken from the rule. Only a named
	// limit can be replaced, as in envoyproxy/ratelimit, so that a
	// replaces entry never removes an unnamed limit whose rule ID happens
	// to be the name it gives.
	Named       bool
	Limit       limiter.Limit
	FailureMode limiter.FailureMode
	// Unit is the configured unit ("second" … "year", lower case), or ""
	// when the limit was given as a window.
	Unit string
	// Pos is where the rate_limit object starts.
	Pos Position
}

// Rule is a compiled descriptor node that carries a rate limit.
// Rules are immutable once compiled and safe for concurrent use.
type Rule struct {
	Domain string
	// ID is the rule's stable, human-readable identity, unique within its
	// domain: the dotted path of keys (with "=value" for valued nodes)
	// from the domain root, e.g. "tenant.user" or "tenant.path=/login*".
	// Storage keys use it.
	ID string
	// Name is the configured rate_limit name when set, else ID. Metric
	// labels and responses use it.
	Name string
	// Limits holds every limit that applies (rate_limit or rate_limits);
	// empty when Unlimited.
	Limits []Limit
	// Unlimited: rate_limit: {unlimited: true}. The request is admitted
	// without touching the store.
	Unlimited bool
	// ShadowMode: the descriptor's shadow_mode. Counted and reported,
	// never denies.
	ShadowMode bool
	// DetailedMetric: the descriptor's detailed_metric. Callers may label
	// metrics with the matched value (mind the cardinality).
	DetailedMetric bool
	// Replaces lists the rate-limit names this rule's limits replace
	// (every name is configured somewhere in the domain; names need not be
	// unique, so one name may stand for several limits). When a request
	// matches this rule and a rule whose limit has a replaced Limit.Name
	// (a Named limit), only this rule's limits apply to it, as in
	// envoyproxy/ratelimit; an Unlimited rule replaces too.
	Replaces []string
	// Shared holds, for each entry of a request that matches the rule,
	// the wildcard value whose matches share one counter (the
	// share_threshold of the descriptor at that level), or "" where every
	// value counts apart; nil when no level shares.
	Shared []string
	// Pos is where the descriptor starts.
	Pos Position
}

// CounterValue returns what names the value v of a matching request's
// entry i in the counter's identity: the shared wildcard value, or v.
func (r *Rule) CounterValue(i int, v string) string {
	if r != nil && i < len(r.Shared) && r.Shared[i] != "" {
		return r.Shared[i]
	}
	return v
}

// DomainSummary describes one loaded domain for check-config and /debug/config.
type DomainSummary struct {
	Domain string
	File   string
	Rules  int
	Limits int
}

// Blocked reports whether l is a limit of zero requests, envoyproxy/ratelimit's
// way to block a value: every request is over the limit, and nothing is
// counted. Its Limit is not valid for a limiter.Limiter; pkg/rls decides it.
func (l *Limit) Blocked() bool { return l.Limit.Requests == 0 }
