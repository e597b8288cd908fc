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
	// rule's ID, followed by "#<index>" when the rule has several limits
	// (rate_limits), e.g. "tenant.user#1".
	ID string
	// Name is the configured rate_limit name, or the rule's Name.
	Name        string
	Limit       limiter.Limit
	FailureMode limiter.FailureMode
	// Unit is the configured unit ("second" … "year"), or "" when the
	// limit was given as a window.
	Unit string
	Pos  Position
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
	Limits         []Limit
	Unlimited      bool
	ShadowMode     bool
	DetailedMetric bool
	// Replaces lists the rate-limit names this rule's limits replace.
	Replaces []string
	Pos      Position
}

// DomainSummary describes one loaded domain for check-config and /debug/config.
type DomainSummary struct {
	Domain string
	File   string
	Rules  int
	Limits int
}
