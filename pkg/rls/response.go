package rls

import (
	"bytes"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// rank orders results from most to least restrictive: an enforced denial,
// then a shadow denial, then an admission.
func rank(q *limiter.Request, r *limiter.Result) int {
	switch {
	case !r.Allowed && !q.Shadow:
		return 0
	case !r.Allowed:
		return 1
	}
	return 2
}

// moreRestrictive reports whether result a is strictly more restrictive than
// b: a better rank; among denials a longer RetryAfter; among admissions fewer
// remaining hits.
func (sc *scratch) moreRestrictive(a, b int) bool {
	ra, rb := rank(&sc.reqs[a], &sc.res[a]), rank(&sc.reqs[b], &sc.res[b])
	if ra != rb {
		return ra < rb
	}
	if ra < 2 {
		return sc.res[a].RetryAfter > sc.res[b].RetryAfter
	}
	return sc.res[a].Remaining < sc.res[b].Remaining
}

func outcomeOf(q *limiter.Request, r *limiter.Result) Outcome {
	switch rank(q, r) {
	case 0:
		return OutcomeOverLimit
	case 1:
		return OutcomeShadowOverLimit
	}
	return OutcomeOK
}

// smallResponse is the largest number of request descriptors whose
// response is allocated as one respBlock.
const smallResponse = 2

// maxHeaders is the largest number of response headers kept in a
// respBlock: the two IETF headers of an OK answer. More (draft-03, or
// Retry-After and Content-Type on OVER_LIMIT) take one more allocation;
// room for them in every block would cost more bytes than it saves (the
// block is sized to fill the 1408-byte size class).
const maxHeaders = 2

// respBlock holds every message of the response to a request of at most
// smallResponse descriptors, so that building it costs one allocation
// instead of one per message. Its parts are referenced from resp only; a
// respBlock is never copied or reused.
type respBlock struct {
	resp     rlsv3.RateLimitResponse
	statuses [smallResponse]*rlsv3.RateLimitResponse_DescriptorStatus
	sts      [smallResponse]rlsv3.RateLimitResponse_DescriptorStatus
	lims     [smallResponse]rlsv3.RateLimitResponse_RateLimit
	durs     [smallResponse]durationpb.Duration
	hdrs     [maxHeaders]*corev3.HeaderValue
	hv       [maxHeaders]corev3.HeaderValue
	meta     metaBlock
}

// hdrBlock holds the response headers when they do not fit a respBlock:
// at most five (draft-03 on OVER_LIMIT: three X-RateLimit-*, Retry-After,
// Content-Type).
type hdrBlock struct {
	hdrs [5]*corev3.HeaderValue
	hv   [5]corev3.HeaderValue
}

// metaBlock holds the messages of the dynamic metadata (see metadata).
type metaBlock struct {
	st   structpb.Struct
	vals [8]structpb.Value
	strs [6]structpb.Value_StringValue
	nums [2]structpb.Value_NumberValue
}

// respond builds the response from the limiter's results in sc.
func (s *Service) respond(req *rlsv3.RateLimitRequest, sc *scratch) *rlsv3.RateLimitResponse {
	n := len(req.Descriptors)
	withLimit := 0
	for i := range sc.descs {
		if sc.descs[i].n > 0 {
			withLimit++
		}
	}
	var (
		blk  *respBlock
		resp *rlsv3.RateLimitResponse
		sts  []rlsv3.RateLimitResponse_DescriptorStatus
		lims []rlsv3.RateLimitResponse_RateLimit
		durs []durationpb.Duration
	)
	if n <= smallResponse {
		blk = new(respBlock)
		resp = &blk.resp
		resp.Statuses = blk.statuses[:n:n]
		sts = blk.sts[:n:n]
		lims = blk.lims[:withLimit:withLimit]
		durs = blk.durs[:withLimit:withLimit]
	} else {
		resp = &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
		sts = make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
		if withLimit > 0 {
			lims = make([]rlsv3.RateLimitResponse_RateLimit, withLimit)
			durs = make([]durationpb.Duration, withLimit)
		}
	}
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	enforced, top := -1, -1 // the request's most restrictive enforced / any result
	li := 0
	for i := range sc.descs {
		ds := &sc.descs[i]
		st := &sts[i]
		resp.Statuses[i] = st
		st.Code = rlsv3.RateLimitResponse_OK
		if ds.n == 0 {
			s.observeDescriptor(req.Domain, ds)
			continue
		}
		best := ds.first
		for k := ds.first; k < ds.first+ds.n; k++ {
			q, r := &sc.reqs[k], &sc.res[k]
			if s.obs != nil {
				m := &sc.meta[k]
				d := Decision{
					Domain: req.Domain, Rule: m.ruleName, Limit: m.name,
					Outcome: outcomeOf(q, r), Source: r.Source,
					Capacity: q.Limit.Capacity(), Remaining: r.Remaining,
				}
				s.obs.ObserveDecision(d)
				if d.Outcome != OutcomeOK {
					s.observeDeny(req, sc, d, k) // DenyObserver (deny.go)
				}
			}
			if k != ds.first && sc.moreRestrictive(k, best) {
				best = k
			}
			if top < 0 || sc.moreRestrictive(k, top) {
				top = k
			}
			if !q.Shadow && (enforced < 0 || sc.moreRestrictive(k, enforced)) {
				enforced = k
			}
		}
		q, r, m := &sc.reqs[best], &sc.res[best], &sc.meta[best]
		if rank(q, r) == 0 {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		cl := &lims[li]
		cl.Name = m.name
		cl.RequestsPerUnit = clamp32(q.Limit.Requests)
		cl.Unit = m.unit
		if m.mult > 1 {
			cl.UnitMultiplier = wrapperspb.UInt32(m.mult)
		}
		st.CurrentLimit = cl
		st.LimitRemaining = clamp32(r.Remaining)
		d := &durs[li]
		d.Seconds = int64(r.ResetAfter / time.Second)
		d.Nanos = int32(r.ResetAfter % time.Second)
		st.DurationUntilReset = d
		li++
	}
	if enforced >= 0 {
		s.addHeaders(resp, sc, enforced, blk)
	}
	if top >= 0 {
		var mb *metaBlock
		if blk != nil {
			mb = &blk.meta
		} else {
			mb = new(metaBlock)
		}
		resp.DynamicMetadata = metadata(req.Domain, sc, top, mb)
	}
	return resp
}

func (s *Service) observeDescriptor(domain string, ds *descState) {
	if s.obs == nil {
		return
	}
	d := Decision{Domain: domain, Outcome: OutcomeNoRule}
	if ds.rule != nil {
		d.Rule = ds.rule.Name
		if ds.kind == kindUnlimited {
			d.Outcome = OutcomeUnlimited
		}
	}
	s.obs.ObserveDecision(d)
}

func clamp32(v uint64) uint32 {
	if v > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(v)
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// windowUnits are the units an arbitrary window is reported in, longest
// first. Weeks, months and years are reported only when configured as such.
var windowUnits = [...]struct {
	d time.Duration
	u rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
}

// reportedUnit is how a limit is reported in a status's current_limit: the
// configured unit when the limit was given as one (unit: minute → MINUTE);
// for a window, the longest of DAY, HOUR, MINUTE, SECOND that divides it,
// with unit_multiplier the quotient when above 1 (window: 90s → 90 × SECOND,
// 2h → 2 × HOUR). A window that is not a whole number of seconds (1500ms) is
// reported as SECOND × the window rounded up to whole seconds (2): the proto
// cannot say it exactly, and a client that reads it then assumes a rate no
// higher than the one enforced.
func reportedUnit(l *descriptors.Limit) (rlsv3.RateLimitResponse_RateLimit_Unit, uint32) {
	switch l.Unit {
	case "second":
		return rlsv3.RateLimitResponse_RateLimit_SECOND, 1
	case "minute":
		return rlsv3.RateLimitResponse_RateLimit_MINUTE, 1
	case "hour":
		return rlsv3.RateLimitResponse_RateLimit_HOUR, 1
	case "day":
		return rlsv3.RateLimitResponse_RateLimit_DAY, 1
	case "week":
		return rlsv3.RateLimitResponse_RateLimit_WEEK, 1
	case "month":
		return rlsv3.RateLimitResponse_RateLimit_MONTH, 1
	case "year":
		return rlsv3.RateLimitResponse_RateLimit_YEAR, 1
	}
	w := l.Limit.Window
	for _, u := range windowUnits {
		if w >= u.d && w%u.d == 0 {
			return u.u, clamp32(uint64(w / u.d))
		}
	}
	return rlsv3.RateLimitResponse_RateLimit_SECOND, clamp32(uint64(max(1, ceilSeconds(w))))
}

// Header names.
const (
	hdrPolicy       = "RateLimit-Policy"
	hdrRateLimit    = "RateLimit"
	hdrXLimit       = "X-RateLimit-Limit"
	hdrXRemaining   = "X-RateLimit-Remaining"
	hdrXReset       = "X-RateLimit-Reset"
	hdrRetryAfter   = "Retry-After"
	hdrContentType  = "Content-Type"
	problemJSONType = "application/problem+json"
)

// endHeader records one header whose value the caller has just appended to
// sc.hdr.
func (sc *scratch) endHeader(name string) {
	sc.hdrNames = append(sc.hdrNames, name)
	sc.hdrEnds = append(sc.hdrEnds, len(sc.hdr))
}

// addHeaders sets response_headers_to_add (and raw_body on OVER_LIMIT) for
// the most restrictive enforced result k, in blk's messages unless blk is
// nil.
func (s *Service) addHeaders(resp *rlsv3.RateLimitResponse, sc *scratch, k int, blk *respBlock) {
	q, r, m := &sc.reqs[k], &sc.res[k], &sc.meta[k]
	window := max(1, ceilSeconds(q.Limit.Window))
	reset := ceilSeconds(r.ResetAfter)
	switch s.headers {
	case HeadersIETF:
		sc.hdr = appendSFString(sc.hdr, m.name)
		sc.hdr = append(sc.hdr, ";q="...)
		sc.hdr = strconv.AppendUint(sc.hdr, q.Limit.Requests, 10)
		sc.hdr = append(sc.hdr, ";w="...)
		sc.hdr = strconv.AppendInt(sc.hdr, window, 10)
		sc.endHeader(hdrPolicy)
		sc.hdr = appendSFString(sc.hdr, m.name)
		sc.hdr = append(sc.hdr, ";r="...)
		sc.hdr = strconv.AppendUint(sc.hdr, r.Remaining, 10)
		sc.hdr = append(sc.hdr, ";t="...)
		sc.hdr = strconv.AppendInt(sc.hdr, reset, 10)
		sc.endHeader(hdrRateLimit)
	case HeadersDraft03:
		sc.hdr = strconv.AppendUint(sc.hdr, q.Limit.Requests, 10)
		sc.hdr = append(sc.hdr, ", "...)
		sc.hdr = strconv.AppendUint(sc.hdr, q.Limit.Requests, 10)
		sc.hdr = append(sc.hdr, ";w="...)
		sc.hdr = strconv.AppendInt(sc.hdr, window, 10)
		if m.name != "" {
			sc.hdr = append(sc.hdr, ";name="...)
			sc.hdr = appendSFString(sc.hdr, m.name)
		}
		sc.endHeader(hdrXLimit)
		sc.hdr = strconv.AppendUint(sc.hdr, r.Remaining, 10)
		sc.endHeader(hdrXRemaining)
		sc.hdr = strconv.AppendInt(sc.hdr, reset, 10)
		sc.endHeader(hdrXReset)
	}
	var retry int64
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		// k is the enforced denial with the longest RetryAfter: the
		// earliest the request as a whole could be admitted.
		retry = max(1, ceilSeconds(r.RetryAfter))
		sc.hdr = strconv.AppendInt(sc.hdr, retry, 10)
		sc.endHeader(hdrRetryAfter)
		sc.hdr = append(sc.hdr, problemJSONType...)
		sc.endHeader(hdrContentType)
		resp.RawBody = problemBody(m.name, q.Limit, retry)
	}
	if len(sc.hdrNames) == 0 {
		return
	}
	values := string(sc.hdr)
	n := len(sc.hdrNames)
	var hv []corev3.HeaderValue
	switch {
	case blk != nil && n <= len(blk.hv):
		hv = blk.hv[:n:n]
		resp.ResponseHeadersToAdd = blk.hdrs[:n:n]
	case n <= len(hdrBlock{}.hv):
		hb := new(hdrBlock)
		hv = hb.hv[:n:n]
		resp.ResponseHeadersToAdd = hb.hdrs[:n:n]
	default:
		hv = make([]corev3.HeaderValue, n)
		resp.ResponseHeadersToAdd = make([]*corev3.HeaderValue, n)
	}
	start := 0
	for i, name := range sc.hdrNames {
		hv[i].Key = name
		hv[i].Value = values[start:sc.hdrEnds[i]]
		start = sc.hdrEnds[i]
		resp.ResponseHeadersToAdd[i] = &hv[i]
	}
}

// appendSFString appends s as an RFC 8941 structured-field String: quoted,
// with \ and " escaped; bytes outside printable ASCII (which an sf-string
// cannot carry) become '?'.
func appendSFString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20 || c > 0x7e:
			dst = append(dst, '?')
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// problem is the RFC 9457 body sent on OVER_LIMIT. Envoy uses raw_body as the
// body of its 429 local reply, and the Content-Type header of
// response_headers_to_add overrides its default text/plain.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Limit is the name of the limit that denied (the one with the
	// longest Retry-After when several did).
	Limit string `json:"limit"`
	// Requests and Window describe it: Requests per Window, where Window
	// is a Go duration ("1m0s").
	Requests uint64 `json:"requests"`
	Window   string `json:"window"`
	// RetryAfter equals the Retry-After header, in whole seconds.
	RetryAfter int64 `json:"retry_after"`
}

// problemBody renders the problem+json body, for example
//
//	{"type":"about:blank","title":"Too Many Requests","status":429,
//	 "detail":"rate limit \"per_ip\" (120 per 1m0s) exceeded; retry after 42 s",
//	 "limit":"per_ip","requests":120,"window":"1m0s","retry_after":42}
//
// It writes the bytes json.Marshal writes for the problem struct (a test
// checks it) without reflection: every OVER_LIMIT answer has a body.
func problemBody(name string, l limiter.Limit, retry int64) []byte {
	var buf [512]byte
	b := append(buf[:0], `{"type":"about:blank","title":"Too Many Requests","status":429,"detail":`...)
	window := l.Window.String()
	var detail [256]byte
	d := append(detail[:0], "rate limit "...)
	d = strconv.AppendQuote(d, name)
	d = append(d, " ("...)
	d = strconv.AppendUint(d, l.Requests, 10)
	d = append(d, " per "...)
	d = append(d, window...)
	d = append(d, ") exceeded; retry after "...)
	d = strconv.AppendInt(d, retry, 10)
	d = append(d, " s"...)
	b = appendJSONString(b, d)
	b = append(b, `,"limit":`...)
	b = appendJSONString(b, name)
	b = append(b, `,"requests":`...)
	b = strconv.AppendUint(b, l.Requests, 10)
	b = append(b, `,"window":`...)
	b = appendJSONString(b, window)
	b = append(b, `,"retry_after":`...)
	b = strconv.AppendInt(b, retry, 10)
	b = append(b, '}')
	return bytes.Clone(b)
}

// appendJSONString appends s as encoding/json writes a string: quoted; ",
// \ and control bytes escaped (\b \f \n \r \t, else \u00XX); <, > and &
// escaped as \u003c, \u003e, \u0026; U+2028 and U+2029 as \u2028 and
// \u2029; each byte of invalid UTF-8 as \ufffd.
func appendJSONString[S string | []byte](dst []byte, s S) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(string(s[i:min(len(s), i+utf8.UTFMax)]))
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// metadata is the response's dynamic_metadata: which limit decided, for
// Envoy access logs (%DYNAMIC_METADATA(envoy.filters.http.ratelimit:rule)%).
// It describes the request's most restrictive result k, shadow ones included:
//
//	domain      the request domain
//	rule        the rule's name ("override" for an override without a rule)
//	rule_id     the rule's ID ("" for an override without a rule)
//	limit       the limit's name
//	decision    ok, over_limit or shadow_over_limit
//	source      who decided: store, fallback, failure_mode_allow, failure_mode_deny
//	descriptor  the index of the request descriptor
//	remaining   the limit's remaining hits
//
// The messages are mb's (allocated with the response: this runs on every
// request that checked a limit); only the map is allocated here.
func metadata(domain string, sc *scratch, k int, mb *metaBlock) *structpb.Struct {
	q, r, m := &sc.reqs[k], &sc.res[k], &sc.meta[k]
	ruleID := ""
	if m.rule != nil {
		ruleID = m.rule.ID
	}
	strs, nums, vals := mb.strs[:], mb.nums[:], mb.vals[:]
	fields := make(map[string]*structpb.Value, 8)
	for i, kv := range [...]struct{ k, v string }{
		{"domain", domain},
		{"rule", m.ruleName},
		{"rule_id", ruleID},
		{"limit", m.name},
		{"decision", outcomeOf(q, r).String()},
		{"source", r.Source.String()},
	} {
		strs[i].StringValue = kv.v
		vals[i].Kind = &strs[i]
		fields[kv.k] = &vals[i]
	}
	nums[0].NumberValue = float64(m.desc)
	nums[1].NumberValue = float64(r.Remaining)
	vals[6].Kind, vals[7].Kind = &nums[0], &nums[1]
	fields["descriptor"], fields["remaining"] = &vals[6], &vals[7]
	mb.st.Fields = fields
	return &mb.st
}
