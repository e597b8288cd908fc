package rls

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
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

// smallResponse and mediumResponse are the largest numbers of request
// descriptors whose response is allocated as one respBlock or one
// respBlock4. Two sizes, so that the usual one or two descriptors do not
// pay for four (every byte allocated brings the next collection nearer),
// while three or four (IP, tenant, user, route…) still cost one allocation
// instead of seven.
const (
	smallResponse  = 2
	mediumResponse = 4
)

// respBlock holds every message of the response to a request of at most
// smallResponse descriptors but its headers, so that building it costs one
// allocation instead of one per message. It is allocated as part of an
// okBlock or a fullBlock, which add room for the headers and bytes for the
// body and the metadata (see respond). Its parts are referenced from resp
// only; a block is never copied or reused.
type respBlock struct {
	resp     rlsv3.RateLimitResponse
	statuses [smallResponse]*rlsv3.RateLimitResponse_DescriptorStatus
	sts      [smallResponse]rlsv3.RateLimitResponse_DescriptorStatus
	lims     [smallResponse]rlsv3.RateLimitResponse_RateLimit
	durs     [smallResponse]durationpb.Duration
}

// okBlock is a respBlock with room for two headers: those of an OK answer
// in the default IETF mode, or Retry-After and Content-Type of an
// OVER_LIMIT answer in HeadersNone mode. Its bytes fill the 1280-byte size
// class: the metadata's fixed part takes about 170 bytes, which leaves
// about 300 for the domain, rule, rule ID and limit name.
type okBlock struct {
	respBlock
	hdrs  [2]*corev3.HeaderValue
	hv    [2]corev3.HeaderValue
	bytes [480]byte
}

// fullBlock is a respBlock with room for five headers: any answer's (on
// OVER_LIMIT in draft-03 mode: three X-RateLimit-*, Retry-After,
// Content-Type). Its bytes fill the 1536-byte size class; the body of an
// OVER_LIMIT answer takes about 200 of them with short names.
type fullBlock struct {
	respBlock
	hdrs  [5]*corev3.HeaderValue
	hv    [5]corev3.HeaderValue
	bytes [424]byte
}

// respBlock4 is respBlock for up to mediumResponse descriptors.
type respBlock4 struct {
	resp     rlsv3.RateLimitResponse
	statuses [mediumResponse]*rlsv3.RateLimitResponse_DescriptorStatus
	sts      [mediumResponse]rlsv3.RateLimitResponse_DescriptorStatus
	lims     [mediumResponse]rlsv3.RateLimitResponse_RateLimit
	durs     [mediumResponse]durationpb.Duration
}

// okBlock4 is okBlock for up to mediumResponse descriptors and an answer
// without a body (see newBlock), filling the 1536-byte size class: its
// bytes hold the metadata with about 130 bytes of names (a longer metadata
// takes an allocation of its own; see cut).
type okBlock4 struct {
	respBlock4
	hdrs  [2]*corev3.HeaderValue
	hv    [2]corev3.HeaderValue
	bytes [304]byte
}

// fullBlock4 is fullBlock for up to mediumResponse descriptors, filling the
// 2048-byte size class.
type fullBlock4 struct {
	respBlock4
	hdrs  [5]*corev3.HeaderValue
	hv    [5]corev3.HeaderValue
	bytes [504]byte
}

// responseBlock is a block that holds a whole response: its messages, for
// n descriptors of which withLimit have a limit (parts: resp's statuses are
// set), and room for its headers, body and metadata.
type responseBlock interface {
	parts(n, withLimit int) (*rlsv3.RateLimitResponse, []rlsv3.RateLimitResponse_DescriptorStatus, []rlsv3.RateLimitResponse_RateLimit, []durationpb.Duration)
	room() ([]*corev3.HeaderValue, []corev3.HeaderValue, []byte)
}

func (b *respBlock) parts(n, withLimit int) (*rlsv3.RateLimitResponse, []rlsv3.RateLimitResponse_DescriptorStatus, []rlsv3.RateLimitResponse_RateLimit, []durationpb.Duration) {
	b.resp.Statuses = b.statuses[:n:n]
	return &b.resp, b.sts[:n:n], b.lims[:withLimit:withLimit], b.durs[:withLimit:withLimit]
}

func (b *respBlock4) parts(n, withLimit int) (*rlsv3.RateLimitResponse, []rlsv3.RateLimitResponse_DescriptorStatus, []rlsv3.RateLimitResponse_RateLimit, []durationpb.Duration) {
	b.resp.Statuses = b.statuses[:n:n]
	return &b.resp, b.sts[:n:n], b.lims[:withLimit:withLimit], b.durs[:withLimit:withLimit]
}

func (b *okBlock) room() ([]*corev3.HeaderValue, []corev3.HeaderValue, []byte) {
	return b.hdrs[:], b.hv[:], b.bytes[:0]
}

func (b *fullBlock) room() ([]*corev3.HeaderValue, []corev3.HeaderValue, []byte) {
	return b.hdrs[:], b.hv[:], b.bytes[:0]
}

func (b *okBlock4) room() ([]*corev3.HeaderValue, []corev3.HeaderValue, []byte) {
	return b.hdrs[:], b.hv[:], b.bytes[:0]
}

func (b *fullBlock4) room() ([]*corev3.HeaderValue, []corev3.HeaderValue, []byte) {
	return b.hdrs[:], b.hv[:], b.bytes[:0]
}

// newBlock returns a block for a response of n descriptors with nh
// headers, and a problem+json body when body is set, or nil when none is
// large enough. An okBlock holds two headers, a body and the metadata; an
// okBlock4 only two headers and the metadata (an OVER_LIMIT answer in
// HeadersNone mode, two headers and a body, takes a fullBlock4).
func newBlock(n, nh int, body bool) responseBlock {
	few := nh <= len(okBlock{}.hv)
	switch {
	case n <= smallResponse && few:
		return new(okBlock)
	case n <= smallResponse:
		return new(fullBlock)
	case n <= mediumResponse && few && !body:
		return new(okBlock4)
	case n <= mediumResponse:
		return new(fullBlock4)
	}
	return nil
}

// hdrBlock holds the headers of a response too large for a respBlock.
type hdrBlock struct {
	hdrs [5]*corev3.HeaderValue
	hv   [5]corev3.HeaderValue
}

// headerCount is the number of headers addHeaders sets for the results in
// sc: none when no enforced limit was checked, else those of the header
// mode, and Retry-After and Content-Type when an enforced limit denied; body
// reports the latter, when addHeaders writes a problem+json body too.
func (s *Service) headerCount(sc *scratch) (n int, body bool) {
	enforced, over := false, false
	for k := range sc.reqs {
		if !sc.reqs[k].Shadow {
			enforced = true
			if !sc.res[k].Allowed {
				over = true
				break
			}
		}
	}
	if enforced {
		switch s.headers {
		case HeadersIETF:
			n = 2
		case HeadersDraft03:
			n = 3
		}
	}
	if over {
		n += 2
	}
	return n, over
}

// cut returns a copy of b in the front of spare (an empty slice with room
// in its capacity), its capacity limited to its length, and the rest of
// spare; when b does not fit, a copy of b and spare.
func cut(spare, b []byte) (cp, rest []byte) {
	if len(b) > cap(spare) {
		return bytes.Clone(b), spare
	}
	cp = append(spare, b...)
	return cp[:len(b):len(b)], cp[len(b):len(b)]
}

// respond builds the response from the limiter's results in sc.
//
// The dynamic metadata is not set as resp.DynamicMetadata but encoded by
// hand into resp's unknown fields (see metadata). As a structpb.Struct, the
// gRPC codec's proto.Size and marshal of the response were about 8.6% of
// the server's CPU in a profile under load, most of it encoding the Struct's
// map of eight fields by reflection (16 allocations per response, plus 2 to
// build the map). Callers in the process read the metadata with Metadata.
func (s *Service) respond(req *rlsv3.RateLimitRequest, sc *scratch) *rlsv3.RateLimitResponse {
	n := len(req.Descriptors)
	withLimit := 0
	for i := range sc.descs {
		if sc.descs[i].n > 0 {
			withLimit++
		}
	}
	var (
		hdrs  []*corev3.HeaderValue // room for the headers
		hv    []corev3.HeaderValue
		spare []byte // room for the body and the metadata
		resp  *rlsv3.RateLimitResponse
		sts   []rlsv3.RateLimitResponse_DescriptorStatus
		lims  []rlsv3.RateLimitResponse_RateLimit
		durs  []durationpb.Duration
	)
	var blk responseBlock
	if n <= mediumResponse {
		nh, body := s.headerCount(sc)
		blk = newBlock(n, nh, body)
	}
	if blk != nil {
		resp, sts, lims, durs = blk.parts(n, withLimit)
		hdrs, hv, spare = blk.room()
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
		spare = s.addHeaders(resp, sc, enforced, hdrs, hv, spare)
	}
	if top >= 0 {
		resp.ProtoReflect().SetUnknown(metadata(spare, req.Domain, sc, top))
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

// maxSFInt is the largest integer a structured field holds (RFC 8941
// §3.3.1: at most 15 digits; a parser rejects the whole field for a longer
// one). A limit or a remaining count may reach 2^53−1, 16 digits.
const maxSFInt = 999_999_999_999_999

// appendSFInt appends v as a structured field's integer, capped at
// maxSFInt.
func appendSFInt(b []byte, v uint64) []byte { return strconv.AppendUint(b, min(v, maxSFInt), 10) }

// ceilSeconds is d in whole seconds, rounded up, without the addition that
// overflows for the longest waits (a token bucket's of over 292 years
// saturate at the largest Duration).
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
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
// the most restrictive enforced result k: in hdrs and hv when they have
// room, the body in spare when it fits. It returns the rest of spare.
func (s *Service) addHeaders(resp *rlsv3.RateLimitResponse, sc *scratch, k int,
	hdrs []*corev3.HeaderValue, hv []corev3.HeaderValue, spare []byte) []byte {
	q, r, m := &sc.reqs[k], &sc.res[k], &sc.meta[k]
	window := max(1, ceilSeconds(q.Limit.Window))
	reset := ceilSeconds(r.ResetAfter)
	switch s.headers {
	case HeadersIETF:
		sc.hdr = appendSFString(sc.hdr, m.name)
		sc.hdr = append(sc.hdr, ";q="...)
		sc.hdr = appendSFInt(sc.hdr, q.Limit.Requests)
		sc.hdr = append(sc.hdr, ";w="...)
		sc.hdr = strconv.AppendInt(sc.hdr, window, 10)
		sc.endHeader(hdrPolicy)
		sc.hdr = appendSFString(sc.hdr, m.name)
		sc.hdr = append(sc.hdr, ";r="...)
		sc.hdr = appendSFInt(sc.hdr, r.Remaining)
		sc.hdr = append(sc.hdr, ";t="...)
		sc.hdr = strconv.AppendInt(sc.hdr, reset, 10)
		sc.endHeader(hdrRateLimit)
	case HeadersDraft03:
		sc.hdr = appendSFInt(sc.hdr, q.Limit.Requests)
		sc.hdr = append(sc.hdr, ", "...)
		sc.hdr = appendSFInt(sc.hdr, q.Limit.Requests)
		sc.hdr = append(sc.hdr, ";w="...)
		sc.hdr = strconv.AppendInt(sc.hdr, window, 10)
		if m.name != "" {
			sc.hdr = append(sc.hdr, ";name="...)
			sc.hdr = appendSFString(sc.hdr, m.name)
		}
		sc.endHeader(hdrXLimit)
		sc.hdr = appendSFInt(sc.hdr, r.Remaining)
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
		var buf [512]byte
		resp.RawBody, spare = cut(spare, appendProblemBody(buf[:0], m.name, q.Limit, retry))
	}
	if len(sc.hdrNames) == 0 {
		return spare
	}
	values := string(sc.hdr)
	n := len(sc.hdrNames)
	switch {
	case n <= len(hv):
		hv = hv[:n:n]
		resp.ResponseHeadersToAdd = hdrs[:n:n]
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
	return spare
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

// appendProblemBody appends the problem+json body to dst, for example
//
//	{"type":"about:blank","title":"Too Many Requests","status":429,
//	 "detail":"rate limit \"per_ip\" (120 per 1m0s) exceeded; retry after 42 s",
//	 "limit":"per_ip","requests":120,"window":"1m0s","retry_after":42}
//
// It writes the bytes json.Marshal writes for the problem struct (a test
// checks it) without reflection: every OVER_LIMIT answer has a body.
func appendProblemBody(dst []byte, name string, l limiter.Limit, retry int64) []byte {
	b := append(dst, `{"type":"about:blank","title":"Too Many Requests","status":429,"detail":`...)
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
	return append(b, '}')
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

// metadata returns the response's dynamic_metadata as an encoded field of
// RateLimitResponse, appended to buf (in buf's array when it has room: the
// array must be the response's own, never reused): which limit decided, for
// Envoy access logs (%DYNAMIC_METADATA(envoy.filters.http.ratelimit:rule)%).
// It is a google.protobuf.Struct describing the request's most restrictive
// result k, shadow ones included:
//
//	domain      the request domain
//	rule        the rule's name ("override" for an override without a rule)
//	rule_id     the rule's ID ("" for an override without a rule)
//	limit       the limit's name
//	decision    ok, over_limit or shadow_over_limit
//	source      who decided: store, fallback, failure_mode_allow, failure_mode_deny
//	descriptor  the index of the request descriptor (a number)
//	remaining   the limit's remaining hits (a number)
//
// This runs on every request that checked a limit, so it writes the bytes
// proto.Marshal writes for that Struct (with Deterministic set: fields in
// key order; a test checks it) directly, instead of building a Struct with
// a map that the gRPC codec then sizes and marshals by reflection. The
// caller attaches them as resp's unknown fields, which the protobuf runtime
// marshals verbatim after the known ones: on the wire they are an ordinary
// dynamic_metadata field, which Envoy (or any client) decodes into the
// Struct.
//
// Every string is valid UTF-8, as proto3 requires: the domain is validated,
// the names and IDs come from the YAML configuration, and the decision and
// source are constants.
func metadata(buf []byte, domain string, sc *scratch, k int) []byte {
	q, r, m := &sc.reqs[k], &sc.res[k], &sc.meta[k]
	ruleID := ""
	if m.rule != nil {
		ruleID = m.rule.ID
	}
	// In key order (metaKeys), as a deterministic marshal writes a map.
	vals := [len(metaKeys)]metaValue{
		{str: outcomeOf(q, r).String()},
		{num: float64(m.desc), isNum: true},
		{str: domain},
		{str: m.name},
		{num: float64(r.Remaining), isNum: true},
		{str: m.ruleName},
		{str: ruleID},
		{str: r.Source.String()},
	}
	var valueLen, entryLen [len(metaKeys)]int
	size := 0
	for i := range vals {
		v := &vals[i]
		if v.isNum {
			valueLen[i] = protowire.SizeTag(valueNumber) + protowire.SizeFixed64()
		} else {
			valueLen[i] = protowire.SizeTag(valueString) + protowire.SizeBytes(len(v.str))
		}
		entryLen[i] = len(metaKeys[i]) + protowire.SizeBytes(valueLen[i])
		size += protowire.SizeTag(structFields) + protowire.SizeBytes(entryLen[i])
	}
	if n := len(buf) + protowire.SizeTag(metadataField) + protowire.SizeBytes(size); n > cap(buf) {
		buf = append(make([]byte, 0, n), buf...)
	}
	buf = protowire.AppendTag(buf, metadataField, protowire.BytesType)
	buf = protowire.AppendVarint(buf, uint64(size))
	for i := range vals {
		v := &vals[i]
		buf = protowire.AppendTag(buf, structFields, protowire.BytesType)
		buf = protowire.AppendVarint(buf, uint64(entryLen[i]))
		buf = append(buf, metaKeys[i]...)
		buf = protowire.AppendVarint(buf, uint64(valueLen[i]))
		if v.isNum {
			buf = protowire.AppendTag(buf, valueNumber, protowire.Fixed64Type)
			buf = protowire.AppendFixed64(buf, math.Float64bits(v.num))
		} else {
			buf = protowire.AppendTag(buf, valueString, protowire.BytesType)
			buf = protowire.AppendString(buf, v.str)
		}
	}
	return buf
}

// metaKeys holds, for every metadata key in key order, the part of its
// map entry that does not depend on the value: the key field (tag, length,
// key) and the tag of the value field. A map entry always carries both its
// key and its value, and a Value its oneof member even when that holds ""
// or 0.
var metaKeys = func() (keys [8]string) {
	for i, k := range [...]string{"decision", "descriptor", "domain", "limit", "remaining", "rule", "rule_id", "source"} {
		b := protowire.AppendTag(nil, entryKey, protowire.BytesType)
		b = protowire.AppendString(b, k)
		b = protowire.AppendTag(b, entryValue, protowire.BytesType)
		keys[i] = string(b)
	}
	return keys
}()

// metadataField is the field number of RateLimitResponse.dynamic_metadata,
// taken from the message descriptor.
var metadataField = func() protowire.Number {
	fd := (*rlsv3.RateLimitResponse)(nil).ProtoReflect().Descriptor().Fields().ByName("dynamic_metadata")
	if fd == nil || fd.Message() == nil || fd.Message().FullName() != "google.protobuf.Struct" || fd.IsList() {
		panic("rls: RateLimitResponse has no dynamic_metadata Struct field")
	}
	return fd.Number()
}()

// Field numbers of google.protobuf.Struct, of its map entries and of
// google.protobuf.Value.
const (
	structFields = 1 // Struct.fields: map<string, Value>, a repeated entry
	entryKey     = 1 // the entry's key: string
	entryValue   = 2 // the entry's value: Value
	valueNumber  = 2 // Value.number_value: double (oneof kind)
	valueString  = 3 // Value.string_value: string (oneof kind)
)

// metaValue is the value of one metadata field: a string or a number.
type metaValue struct {
	str   string
	num   float64
	isNum bool
}

// Metadata returns the dynamic_metadata of resp, or nil when it has none.
// A response returned by Service.ShouldRateLimit carries its metadata
// encoded in its unknown fields (see respond), so its DynamicMetadata field
// is nil: callers in the process must read the metadata with Metadata, never
// resp.DynamicMetadata. A response decoded from the wire (a gRPC client's)
// has DynamicMetadata set, which Metadata returns as is.
func Metadata(resp *rlsv3.RateLimitResponse) (*structpb.Struct, error) {
	if md := resp.GetDynamicMetadata(); md != nil || resp == nil {
		return md, nil
	}
	raw := resp.ProtoReflect().GetUnknown()
	if len(raw) == 0 {
		return nil, nil
	}
	var dec rlsv3.RateLimitResponse
	if err := proto.Unmarshal(raw, &dec); err != nil {
		return nil, fmt.Errorf("rls: decoding the response's dynamic_metadata: %w", err)
	}
	return dec.DynamicMetadata, nil
}
