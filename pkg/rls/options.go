package rls

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// ConfigSource hands out the current descriptor configuration. Current is
// called once per request and must be cheap and safe for concurrent use (an
// atomic load of an immutable snapshot); it returns nil while no
// configuration is loaded, and the Service then answers Unavailable.
type ConfigSource interface {
	Current() *descriptors.Config
}

// HeaderMode selects the rate-limit response headers the Service asks Envoy
// to add (response_headers_to_add). The zero value is HeadersIETF.
//
// Each mode describes the single most restrictive enforced limit of the
// request: on OVER_LIMIT the denied limit with the longest Retry-After, else
// the limit with the fewest remaining hits (the first such one in request
// order). Shadow limits never appear in headers: shadow mode must not change
// what clients see. Every mode adds Retry-After on OVER_LIMIT.
type HeaderMode uint8

const (
	// HeadersIETF adds the fields of draft-ietf-httpapi-ratelimit-headers
	// (the structured-field revisions, -07 onwards):
	//
	//	RateLimit-Policy: "per_ip";q=120;w=60
	//	RateLimit: "per_ip";r=119;t=42
	//
	// q is the limit's requests per window, w the window in seconds
	// (rounded up), r the remaining hits and t the seconds until the window
	// resets (rounded up). For a token bucket q and w are its rate
	// (requests_per_unit per window), r the tokens left (at most the burst)
	// and t the time until the bucket is full again.
	HeadersIETF HeaderMode = iota
	// HeadersDraft03 adds the X-RateLimit-* names of draft 03, in the
	// format Envoy's own enable_x_ratelimit_headers (DRAFT_VERSION_03)
	// produces:
	//
	//	X-RateLimit-Limit: 120, 120;w=60;name="per_ip"
	//	X-RateLimit-Remaining: 119
	//	X-RateLimit-Reset: 42
	//
	// Envoy can compute these itself from the descriptor statuses; use this
	// mode only where that Envoy option is off (or for clients of other
	// proxies), else the headers appear twice.
	HeadersDraft03
	// HeadersNone adds no rate-limit fields (Retry-After on OVER_LIMIT is
	// still added: it is what a 429 means).
	HeadersNone
)

var headerModeNames = [...]string{HeadersIETF: "ietf", HeadersDraft03: "draft03", HeadersNone: "none"}

// String returns the flag spelling of m: "ietf", "draft03" or "none".
func (m HeaderMode) String() string {
	if int(m) < len(headerModeNames) {
		return headerModeNames[m]
	}
	return fmt.Sprintf("header_mode(%d)", uint8(m))
}

// ParseHeaderMode parses a flag value: "ietf" (also the empty string),
// "draft03" or "none".
func ParseHeaderMode(s string) (HeaderMode, error) {
	if s == "" {
		return HeadersIETF, nil
	}
	for i, n := range headerModeNames {
		if n == s {
			return HeaderMode(i), nil
		}
	}
	return 0, fmt.Errorf("unknown header mode %q (want ietf, draft03 or none)", s)
}

// RequestLimits bounds what one RateLimitRequest may carry. A request outside
// them is answered InvalidArgument and nothing is counted. Zero fields take
// the defaults below, which are generous for any Envoy rate-limit action
// (Envoy sends a handful of descriptors of a few entries each) while keeping
// the work of one request, and the size of the counter keys it creates,
// bounded. The descriptors and entries of a request are counted before it
// is decoded, so that a request over those limits costs no memory for
// them; and a server built with grpc.MaxRecvMsgSize(Service.MaxRequestBytes())
// refuses, unread, a request longer than the largest within the limits.
type RequestLimits struct {
	// MaxDescriptors is the most descriptors in one request. Default 64.
	MaxDescriptors int
	// MaxEntries is the most entries in one descriptor. Default 16.
	MaxEntries int
	// MaxDomainBytes is the longest domain, in bytes. Default 256.
	MaxDomainBytes int
	// MaxKeyBytes is the longest entry key, in bytes. Default 256.
	MaxKeyBytes int
	// MaxValueBytes is the longest entry value, in bytes, that names its
	// counter as it is. Default 1024 (room for a long path or a JWT
	// subject). A longer value is not refused, since it is often a
	// client's: its counter is named by its SHA-256 instead.
	MaxValueBytes int
}

// Defaults of RequestLimits.
const (
	DefaultMaxDescriptors = 64
	DefaultMaxEntries     = 16
	DefaultMaxDomainBytes = 256
	DefaultMaxKeyBytes    = 256
	DefaultMaxValueBytes  = 1024
)

func (l RequestLimits) withDefaults() RequestLimits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxDescriptors, DefaultMaxDescriptors)
	def(&l.MaxEntries, DefaultMaxEntries)
	def(&l.MaxDomainBytes, DefaultMaxDomainBytes)
	def(&l.MaxKeyBytes, DefaultMaxKeyBytes)
	def(&l.MaxValueBytes, DefaultMaxValueBytes)
	return l
}

// Outcome is what happened to one limit (or one descriptor) of a request,
// as reported to an Observer.
type Outcome uint8

const (
	// OutcomeOK: the limit admitted the request's hits.
	OutcomeOK Outcome = iota
	// OutcomeOverLimit: an enforced limit denied; Envoy gets OVER_LIMIT.
	OutcomeOverLimit
	// OutcomeShadowOverLimit: a shadow limit (rule shadow_mode or the
	// global shadow option) would have denied; Envoy gets OK.
	OutcomeShadowOverLimit
	// OutcomeUnlimited: the descriptor matched an unlimited rule.
	OutcomeUnlimited
	// OutcomeNoRule: the descriptor matched no rule (or every limit of
	// its rule was replaced by another rule of the request).
	OutcomeNoRule
)

var outcomeNames = [...]string{
	OutcomeOK:              "ok",
	OutcomeOverLimit:       "over_limit",
	OutcomeShadowOverLimit: "shadow_over_limit",
	OutcomeUnlimited:       "unlimited",
	OutcomeNoRule:          "no_rule",
}

// String returns a metric-label spelling of o, e.g. "shadow_over_limit".
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Decision is one observed outcome. Domain, Rule and Limit come from the
// configuration (bounded), except for a per-descriptor limit override without
// a matching rule, whose Rule and Limit are "override".
type Decision struct {
	Domain string
	// Rule is the rule's Name: "" for OutcomeNoRule when no rule matched,
	// the matched rule's when another rule of the request replaced all its
	// limits.
	Rule string
	// Limit is the limit's Name ("" for OutcomeUnlimited and OutcomeNoRule).
	Limit   string
	Outcome Outcome
	// Source says who decided (store, fallback, failure_mode_*); only
	// meaningful for OutcomeOK, OutcomeOverLimit and OutcomeShadowOverLimit.
	Source limiter.Source
	// Capacity and Remaining are the limit's capacity (requests, or burst
	// for a token bucket; 0 for a blocked limit) and what remained after
	// the decision, so an observer can tell how close a client runs to its
	// limit. Zero for OutcomeUnlimited and OutcomeNoRule.
	Capacity, Remaining uint64
}

// Observer receives what the Service decided, for metrics. It is called on
// the request path, synchronously, so it must be fast and safe for concurrent
// use. A nil Observer is allowed.
type Observer interface {
	// ObserveDecision is called once per checked limit, and once per
	// descriptor that matched no rule or an unlimited rule.
	ObserveDecision(Decision)
	// UnknownDomain is called for every request whose domain is not
	// configured. The domain is client input: an implementation must bound
	// what it does with it (e.g. one counter without the domain label).
	UnknownDomain(domain string)
}

// LineLimiter writes log lines of one kind at most so often
// (internal/logevery.Limiter).
type LineLimiter interface {
	Log(ctx context.Context, log *slog.Logger, level slog.Level, kind, msg string, attrs ...slog.Attr)
}

// everyLine is the LineLimiter that writes every line.
type everyLine struct{}

func (everyLine) Log(ctx context.Context, log *slog.Logger, level slog.Level, _, msg string, attrs ...slog.Attr) {
	log.LogAttrs(ctx, level, msg, attrs...)
}

// Options configures a Service.
type Options struct {
	// Config supplies the current descriptor configuration. Required.
	Config ConfigSource
	// Limiter decides the limits; usually the fail-soft wrapper around
	// Redis, or the memory backend. Required.
	Limiter limiter.Limiter
	// Headers selects the response headers. Default HeadersIETF.
	Headers HeaderMode
	// Shadow puts every limit in shadow mode: counted, reported in
	// statuses, metrics and metadata, never OVER_LIMIT. Default off.
	Shadow bool
	// Logger receives unknown-domain notices and limiter errors. Default:
	// discard.
	Logger *slog.Logger
	// Lines bounds the limiter-error lines, which can come once per
	// request (every caller giving up while Redis is slow): each kind, a
	// gRPC code in a domain, goes through Lines.Log
	// (internal/logevery.Limiter writes it at most once per interval).
	// Default: every line is written.
	Lines LineLimiter
	// Limits bounds request sizes; see RequestLimits for the defaults.
	Limits RequestLimits
	// Observer receives decisions for metrics. Default: none.
	Observer Observer
	// MaxUnknownDomains is how many distinct unknown domains are
	// remembered so that each is logged once; further ones are logged
	// through Lines (summarised). Default 1000.
	MaxUnknownDomains int
}
