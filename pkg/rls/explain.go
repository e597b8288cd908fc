package rls

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// Explanation says how the Service treats one descriptor: the rule it
// matches and the state of each limit's counter, observed without counting.
// It is what /debug/explain shows.
type Explanation struct {
	Domain  string           `json:"domain"`
	Entries []ExplainedEntry `json:"entries"`
	// KnownDomain is false when the domain is not configured (the Service
	// answers OK without limits).
	KnownDomain bool `json:"known_domain"`
	// ConfigDigest identifies the configuration that was consulted.
	ConfigDigest string `json:"config_digest"`
	// Rule is the matched rule; nil when no rule matches.
	Rule *ExplainedRule `json:"rule"`
	// Limits holds one element per limit of the rule, in configuration
	// order, with its counter state.
	Limits []ExplainedLimit `json:"limits"`
	// Code is what ShouldRateLimit would answer now for a request with
	// this descriptor alone and one hit: "OK" or "OVER_LIMIT".
	Code string `json:"code"`
}

// ExplainedEntry is one entry of the explained descriptor.
type ExplainedEntry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// ExplainedRule describes a matched rule.
type ExplainedRule struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Position is where the descriptor is configured, file:line:col.
	Position  string `json:"position"`
	Unlimited bool   `json:"unlimited"`
	// ShadowMode is the rule's shadow_mode; Shadow (per limit) also
	// reflects the service-wide --shadow.
	ShadowMode     bool     `json:"shadow_mode"`
	DetailedMetric bool     `json:"detailed_metric,omitempty"`
	Replaces       []string `json:"replaces,omitempty"`
}

// ExplainedLimit is one limit of the matched rule and the state of its
// counter for the explained descriptor.
type ExplainedLimit struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Position string `json:"position"`
	// Algorithm is the configuration name, e.g. "sliding_window".
	Algorithm string `json:"algorithm"`
	Requests  uint64 `json:"requests"`
	// Window is a Go duration, e.g. "1m0s"; WindowMS the same in ms.
	Window   string `json:"window"`
	WindowMS int64  `json:"window_ms"`
	Unit     string `json:"unit,omitempty"`
	Burst    uint64 `json:"burst,omitempty"`
	// FailureMode is what applies while the store is unavailable.
	FailureMode string `json:"failure_mode"`
	// Shadow: counted and reported, never denies (the rule's shadow_mode
	// or the service-wide shadow option).
	Shadow bool `json:"shadow"`
	// Blocked: requests_per_unit 0, every request is denied and nothing is
	// counted (the store is not asked).
	Blocked bool `json:"blocked,omitempty"`

	// The counter, as the limiter reports it for a check of one hit that
	// consumes nothing.
	Allowed      bool   `json:"allowed"`
	Remaining    uint64 `json:"remaining"`
	ResetAfterMS int64  `json:"reset_after_ms"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	// Source says who decided: store, fallback, failure_mode_allow,
	// failure_mode_deny; empty for a blocked limit.
	Source string `json:"source,omitempty"`
}

// Explain reports which rule of the current configuration matches the
// descriptor entries in domain, and the state of each of its limits'
// counters, WITHOUT counting: every limit is checked with Hits 0, which
// consumes nothing (see limiter.Request). It emits no Observer decisions.
//
// The descriptor is explained alone: replaces between descriptors of one
// request and Envoy's per-descriptor limit overrides do not apply. Errors
// are gRPC statuses, as ShouldRateLimit's: InvalidArgument for an input
// outside the RequestLimits, Unavailable when no configuration is loaded or
// the store cannot decide. Explain is safe for concurrent use.
func (s *Service) Explain(ctx context.Context, domain string, entries []descriptors.Entry) (Explanation, error) {
	if err := s.validateExplain(domain, entries); err != nil {
		return Explanation{}, err
	}
	cfg := s.cfg.Current()
	if cfg == nil {
		return Explanation{}, status.Error(codes.Unavailable, "no rate limit configuration loaded")
	}
	ex := Explanation{
		Domain:       domain,
		Entries:      make([]ExplainedEntry, len(entries)),
		KnownDomain:  cfg.HasDomain(domain),
		ConfigDigest: cfg.Digest(),
		Code:         "OK",
		Limits:       []ExplainedLimit{},
	}
	for i, e := range entries {
		ex.Entries[i] = ExplainedEntry{Key: e.Key, Value: e.Value}
	}
	rule := cfg.Match(domain, entries)
	if rule == nil {
		return ex, nil
	}
	ex.Rule = &ExplainedRule{
		ID: rule.ID, Name: rule.Name, Position: rule.Pos.String(), Unlimited: rule.Unlimited,
		ShadowMode: rule.ShadowMode, DetailedMetric: rule.DetailedMetric, Replaces: rule.Replaces,
	}
	if rule.Unlimited {
		return ex, nil
	}
	var (
		reqs []limiter.Request
		idx  []int // index in ex.Limits of each request
	)
	for i := range rule.Limits {
		l := &rule.Limits[i]
		el := ExplainedLimit{
			ID: l.ID, Name: l.Name, Position: l.Pos.String(),
			Algorithm: l.Limit.Algorithm.String(), Requests: l.Limit.Requests,
			Window: l.Limit.Window.String(), WindowMS: l.Limit.Window.Milliseconds(),
			Unit: l.Unit, Burst: l.Limit.Burst, FailureMode: l.FailureMode.String(),
			Shadow: s.shadow || rule.ShadowMode, Blocked: l.Blocked(),
		}
		if el.Blocked {
			// As ShouldRateLimit reports it (see unblock).
			el.ResetAfterMS, el.RetryAfterMS = el.WindowMS, el.WindowMS
		} else {
			reqs = append(reqs, limiter.Request{
				Key:         explainKey(domain, l.ID, rule, entries, s.limits.MaxValueBytes),
				Limit:       l.Limit,
				Hits:        0, // check only: consumes nothing
				Shadow:      el.Shadow,
				FailureMode: l.FailureMode,
			})
			idx = append(idx, len(ex.Limits))
		}
		ex.Limits = append(ex.Limits, el)
	}
	if len(reqs) > 0 {
		res := make([]limiter.Result, len(reqs))
		if err := s.lim.Check(ctx, reqs, res); err != nil {
			return Explanation{}, s.limiterError(ctx, domain, err)
		}
		for j, r := range res {
			el := &ex.Limits[idx[j]]
			el.Allowed, el.Remaining, el.Source = r.Allowed, r.Remaining, r.Source.String()
			el.ResetAfterMS, el.RetryAfterMS = r.ResetAfter.Milliseconds(), ceilMS(r.RetryAfter)
		}
	}
	for _, el := range ex.Limits {
		if !el.Allowed && !el.Shadow {
			ex.Code = "OVER_LIMIT"
		}
	}
	return ex, nil
}

// explainKey is the counter key ShouldRateLimit uses for limit id and a
// descriptor with these entries (see plan).
func explainKey(domain, id string, rule *descriptors.Rule, entries []descriptors.Entry, maxValue int) string {
	var b []byte
	b = limiter.AppendKeyPart(b, domain)
	b = limiter.AppendKeyPart(b, id)
	for i, e := range entries {
		b = limiter.AppendKeyPart(b, e.Key)
		b = appendValue(b, rule.CounterValue(i, e.Value), maxValue)
	}
	return string(b)
}

func ceilMS(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// validateExplain applies the bounds of a RateLimitRequest (see validate)
// to explain's input, with the same messages; the descriptor is number 0.
func (s *Service) validateExplain(domain string, entries []descriptors.Entry) error {
	lim := &s.limits
	if err := checkString("domain", domain, lim.MaxDomainBytes); err != nil {
		return err
	}
	switch m := len(entries); {
	case m == 0:
		return invalid("descriptors[0].entries: must not be empty")
	case m > lim.MaxEntries:
		return invalid("descriptors[0].entries: %d entries exceed the maximum of %d", m, lim.MaxEntries)
	}
	for j, e := range entries {
		if err := checkEntry(0, j, e.Key, lim); err != nil {
			return err
		}
	}
	return nil
}

// FormatExplanation writes ex for people, as /debug/explain?format=text
// shows it, for example:
//
//	domain edge, descriptor remote_address=10.0.0.1: OK
//	rule     per_ip (id remote_address) at config/edge.yaml:4:5
//	#  LIMIT   ALGORITHM       RATE        FAILURE   SHADOW  ALLOWED  REMAINING  RESET  RETRY  SOURCE
//	0  per_ip  sliding_window  100/1m0s    fallback  no      yes      97         41.2s  -      store
func FormatExplanation(w io.Writer, ex Explanation) error {
	bw := bufio.NewWriter(w)
	kv := make([]string, len(ex.Entries))
	for i, e := range ex.Entries {
		kv[i] = e.Key + "=" + e.Value
	}
	fmt.Fprintf(bw, "domain %s, descriptor %s: %s\n", ex.Domain, strings.Join(kv, ","), ex.Code)
	switch {
	case !ex.KnownDomain:
		fmt.Fprintln(bw, "domain not configured: answered OK without limits")
	case ex.Rule == nil:
		fmt.Fprintln(bw, "no rule matches: answered OK without limits")
	default:
		r := ex.Rule
		fmt.Fprintf(bw, "rule %s (id %s) at %s", r.Name, r.ID, r.Position)
		if r.ShadowMode {
			fmt.Fprint(bw, ", shadow_mode")
		}
		if len(r.Replaces) > 0 {
			fmt.Fprintf(bw, ", replaces %s", strings.Join(r.Replaces, ","))
		}
		fmt.Fprintln(bw)
		if r.Unlimited {
			fmt.Fprintln(bw, "unlimited: answered OK, nothing counted")
		}
	}
	if len(ex.Limits) > 0 {
		tw := tabwriter.NewWriter(bw, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "#\tLIMIT\tALGORITHM\tRATE\tFAILURE\tSHADOW\tALLOWED\tREMAINING\tRESET\tRETRY\tSOURCE\tAT")
		for i, l := range ex.Limits {
			rate := fmt.Sprintf("%d/%s", l.Requests, l.Window)
			if l.Burst > 0 {
				rate += fmt.Sprintf(" burst %d", l.Burst)
			}
			retry, source := "-", l.Source
			if !l.Allowed {
				retry = msString(l.RetryAfterMS)
			}
			if l.Blocked {
				source = "blocked"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", i, l.Name, l.Algorithm, rate,
				l.FailureMode, yesNo(l.Shadow), yesNo(l.Allowed), l.Remaining, msString(l.ResetAfterMS), retry,
				source, l.Position)
		}
		tw.Flush()
	}
	fmt.Fprintf(bw, "config %s\n", ex.ConfigDigest)
	return bw.Flush()
}

func msString(ms int64) string { return (time.Duration(ms) * time.Millisecond).String() }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
