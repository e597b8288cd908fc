package rls

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
)

// Service implements envoy.service.ratelimit.v3.RateLimitService. It is safe
// for concurrent use; it holds no per-request state between calls.
type Service struct {
	cfg     ConfigSource
	lim     limiter.Limiter
	headers HeaderMode
	shadow  bool
	log     *slog.Logger
	limits  RequestLimits
	obs     Observer
	unknown unknownDomains
	lines   LineLimiter
	pool    sync.Pool // *scratch
}

// New returns a Service. Config and Limiter are required.
func New(opts Options) (*Service, error) {
	if opts.Config == nil {
		return nil, errors.New("rls: Options.Config is required")
	}
	if opts.Limiter == nil {
		return nil, errors.New("rls: Options.Limiter is required")
	}
	if opts.Headers > HeadersNone {
		return nil, fmt.Errorf("rls: unknown header mode %v", opts.Headers)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	maxUnknown := opts.MaxUnknownDomains
	if maxUnknown <= 0 {
		maxUnknown = 1000
	}
	s := &Service{
		cfg:     opts.Config,
		lim:     opts.Limiter,
		headers: opts.Headers,
		shadow:  opts.Shadow,
		log:     log,
		limits:  opts.Limits.withDefaults(),
		obs:     opts.Observer,
		unknown: unknownDomains{max: maxUnknown},
		lines:   opts.Lines,
	}
	if s.lines == nil {
		s.lines = everyLine{}
	}
	s.pool.New = func() any { return new(scratch) }
	return s, nil
}

// Register registers s on srv as envoy.service.ratelimit.v3.RateLimitService.
//
// It registers a service description equal to the generated one except that
// the request is decoded leniently: a request with a string that is not
// UTF-8 is answered InvalidArgument naming the field (standard decoding would
// answer Internal before s saw it). Interceptors see a
// *rlsv3.RateLimitRequest as usual.
func (s *Service) Register(srv grpc.ServiceRegistrar) {
	srv.RegisterService(&serviceDesc, s)
}

// MaxRequestBytes is the encoded size of the largest request s accepts
// whose values are at most RequestLimits.MaxValueBytes long: 1,322,569
// bytes with the default limits (see RequestLimits). Give it to
// grpc.MaxRecvMsgSize, so that the server refuses a longer message
// (ResourceExhausted) by its length prefix, before reading it, instead of
// at gRPC's default of 4 MiB.
func (s *Service) MaxRequestBytes() int {
	return s.limits.maxRequestBytes()
}

// serviceDesc is rlsv3.RateLimitService_ServiceDesc with the lenient handler.
// It is never modified.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: "envoy.service.ratelimit.v3.RateLimitService",
	HandlerType: (*rlsv3.RateLimitServiceServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "ShouldRateLimit",
		Handler:    shouldRateLimitHandler,
	}},
	Streams:  []grpc.StreamDesc{},
	Metadata: "envoy/service/ratelimit/v3/rls.proto",
}

func shouldRateLimitHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	s := srv.(*Service)
	in := &lenientRequest{limits: &s.limits}
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		if in.err != nil {
			return nil, in.err
		}
		return s.ShouldRateLimit(ctx, &in.req)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	return interceptor(ctx, &in.req, info, func(ctx context.Context, req any) (any, error) {
		if in.err != nil {
			return nil, in.err
		}
		return s.ShouldRateLimit(ctx, req.(*rlsv3.RateLimitRequest))
	})
}

// ShouldRateLimit answers one Envoy request.
//
// Errors are gRPC statuses: InvalidArgument for a malformed request (nothing
// is counted), Unavailable when no configuration is loaded or the limiter
// reports limiter.ErrUnavailable, DeadlineExceeded/Canceled when ctx ends
// first, Internal otherwise. A response's overall code is OK or OVER_LIMIT,
// never UNKNOWN (Envoy would treat UNKNOWN as OK).
//
// Semantics, for each request descriptor in order:
//
//   - Unknown domain: every descriptor is OK with no limit (as the
//     incumbent); the domain is logged once and reported to the Observer.
//   - The descriptor is matched with Config.Match. No rule: OK without
//     current_limit. An unlimited rule: OK without current_limit, nothing is
//     counted.
//   - Each limit of the rule becomes one limiter.Request keyed by (domain,
//     limit ID, every request entry key and value), so a key-only rule gives
//     each distinct value its own counter. All requests of the Envoy request
//     go to the limiter in one Check call, all-or-nothing.
//   - Hits: the request's hits_addend, 0 meaning 1; a descriptor's own
//     hits_addend, when present, replaces it, and an explicit 0 checks
//     without consuming. A descriptor with is_negative_hits asks for a
//     refund, which the limiter contract cannot express: it is checked
//     without consuming, in shadow mode (it never makes the answer
//     OVER_LIMIT).
//   - Envoy's per-descriptor limit override (known domains only, as the
//     incumbent) replaces the matched rule's limits, and applies even when
//     no rule or an unlimited rule matched: one limit of requests_per_unit
//     per unit × unit_multiplier (a month is 30 days, a year 365), with the
//     algorithm and failure mode of the matched rule's first limit, else
//     sliding_window and fallback. Its counter is keyed by the domain and
//     the entries under an identity no rule can have. Following the
//     incumbent, the rule's shadow_mode and replaces do not apply to an
//     override (the global Shadow option does). It is reported under the
//     rule's name, or "override" when no rule matched.
//   - replaces: a rule whose replaces lists a name removes, within this
//     request, every limit of the other matched rules that carries that
//     name (as the incumbent does). A rule never removes its own limits;
//     unlimited rules and overrides replace nothing. A descriptor left with
//     no limit is OK without current_limit.
//   - Shadow: a limit of a shadow_mode rule, or any limit when
//     Options.Shadow is set, is counted and reported but never vetoes: its
//     status is OK even when it would deny (Observer: shadow_over_limit).
//   - The descriptor's status reports its most restrictive limit: an
//     enforced denial (the longest Retry-After), else a shadow denial, else
//     the fewest remaining hits (the first one on a tie).
//
// The overall code is OVER_LIMIT iff an enforced limit denied. Response
// headers, body and metadata are described at HeaderMode, appendProblemBody and
// metadata. The metadata is encoded in the response's unknown fields, not
// set as DynamicMetadata (see respond): it reaches the wire as the
// dynamic_metadata field, and callers in the process read it with Metadata.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := s.validate(req); err != nil {
		return nil, err
	}
	cfg := s.cfg.Current()
	if cfg == nil {
		return nil, status.Error(codes.Unavailable, "no rate limit configuration loaded")
	}
	if !cfg.HasDomain(req.Domain) {
		return s.unknownDomain(ctx, req), nil
	}
	sc := s.pool.Get().(*scratch)
	defer s.putScratch(sc)
	if err := s.plan(cfg, req, sc); err != nil {
		return nil, err
	}
	if len(sc.reqs) > 0 {
		if err := s.lim.Check(ctx, sc.reqs, sc.res); err != nil {
			return nil, s.limiterError(ctx, req.Domain, err)
		}
		sc.unblock()
	}
	return s.respond(req, sc), nil
}

func (s *Service) limiterError(ctx context.Context, domain string, err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, limiter.ErrUnavailable):
		code = codes.Unavailable
	}
	s.lines.Log(ctx, s.log, slog.LevelWarn, "code="+code.String()+" domain="+domain, "rate limit check failed",
		slog.String("domain", domain), slog.String("code", code.String()), slog.Any("error", err))
	return status.Errorf(code, "rate limit check: %v", err)
}

func (s *Service) unknownDomain(ctx context.Context, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	switch s.unknown.first(req.Domain) {
	case domainNew:
		s.log.Warn("request for an unknown domain: answering OK without limits", slog.String("domain", req.Domain))
	case domainNotRemembered:
		// More unknown domains than are remembered: one line per
		// repeat interval, with the count of the others.
		s.lines.Log(ctx, s.log, slog.LevelWarn, "unknown domain, not remembered",
			"request for an unknown domain: answering OK without limits (more unknown domains than are remembered, so this line is summarised)",
			slog.String("domain", req.Domain))
	}
	if s.obs != nil {
		s.obs.UnknownDomain(req.Domain)
	}
	n := len(req.Descriptors)
	sts := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, n),
	}
	for i := range sts {
		sts[i].Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = &sts[i]
	}
	return resp
}

// unknownDomains remembers the unknown domains already logged, at most max
// of them: a client inventing domains costs max strings of memory, one log
// line for each of the first max, and the summarised lines of the line
// limiter for the rest. (Forgetting them all when full, as it once did, made
// a client cycling through max+1 domains cost a line per request.)
type unknownDomains struct {
	mu   sync.Mutex
	max  int
	seen map[string]struct{}
}

// Whether an unknown domain was seen before (unknownDomains.first).
const (
	domainSeen          = iota // remembered: logged before
	domainNew                  // remembered now: log it
	domainNotRemembered        // new, and the memory is full
)

// first reports whether domain is remembered, new (and remembers it), or
// new while max domains are remembered.
func (u *unknownDomains) first(domain string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.seen[domain]; ok {
		return domainSeen
	}
	if len(u.seen) >= u.max {
		return domainNotRemembered
	}
	if u.seen == nil {
		u.seen = make(map[string]struct{}, min(u.max, 64))
	}
	u.seen[domain] = struct{}{}
	return domainNew
}

// descKind is what a request descriptor turned into.
type descKind uint8

const (
	kindNone      descKind = iota // no rule matched
	kindUnlimited                 // an unlimited rule matched
	kindRule                      // a rule with limits matched
	kindOverride                  // Envoy sent a limit override
)

type descState struct {
	kind descKind
	rule *descriptors.Rule // nil for kindNone and an override without a rule
	// first and n delimit the descriptor's limiter requests in
	// scratch.reqs; n may be 0 for kindRule when replaces removed every
	// limit.
	first, n int
}

// reqMeta describes scratch.reqs[k] for the response.
type reqMeta struct {
	desc     int
	rule     *descriptors.Rule
	ruleName string
	name     string // the limit's name
	unit     rlsv3.RateLimitResponse_RateLimit_Unit
	mult     uint32
	keyStart int
	keyEnd   int
	blocked  bool // a requests_per_unit: 0 limit, sent as 2 hits of 1 request
}

type replacer struct {
	name string
	by   *descriptors.Rule
}

// scratch is the per-request working memory, reused through Service.pool so
// that the hot path allocates only what the response itself needs.
type scratch struct {
	key       []byte // every request key, back to back
	entries   []descriptors.Entry
	descs     []descState
	reqs      []limiter.Request
	res       []limiter.Result
	meta      []reqMeta
	replacing []replacer
	hdr       []byte   // header values, back to back
	hdrEnds   []int    // end offset of each header value in hdr
	hdrNames  []string // name of each header
}

func (s *Service) putScratch(sc *scratch) {
	// Drop references into the request and the configuration so a pooled
	// scratch keeps neither alive.
	clear(sc.entries)
	clear(sc.descs)
	clear(sc.reqs)
	clear(sc.meta)
	clear(sc.replacing)
	clear(sc.hdrNames)
	sc.key = sc.key[:0]
	sc.entries = sc.entries[:0]
	sc.descs = sc.descs[:0]
	sc.reqs = sc.reqs[:0]
	sc.res = sc.res[:0]
	sc.meta = sc.meta[:0]
	sc.replacing = sc.replacing[:0]
	sc.hdr = sc.hdr[:0]
	sc.hdrEnds = sc.hdrEnds[:0]
	sc.hdrNames = sc.hdrNames[:0]
	s.pool.Put(sc)
}

// overrideName names an override's limit when no rule matched.
const overrideName = "override"

// plan matches every descriptor and builds the limiter requests in sc. It
// fails (InvalidArgument) on a limit override that the matched rule's
// algorithm does not count.
func (s *Service) plan(cfg *descriptors.Config, req *rlsv3.RateLimitRequest, sc *scratch) error {
	domain := req.Domain
	defHits := uint64(req.HitsAddend)
	if defHits == 0 {
		defHits = 1
	}

	// Pass 1: match, and collect the names replaced by matched rules.
	for _, d := range req.Descriptors {
		sc.entries = sc.entries[:0]
		for _, e := range d.Entries {
			sc.entries = append(sc.entries, descriptors.Entry{Key: e.Key, Value: e.Value})
		}
		rule := cfg.Match(domain, sc.entries)
		ds := descState{rule: rule}
		switch {
		case d.Limit != nil:
			ds.kind = kindOverride
		case rule == nil:
			ds.kind = kindNone
		default:
			// An unlimited rule replaces too (envoyproxy/ratelimit
			// collects a matched limit's replaces before it drops the
			// unlimited ones): "VIP: unlimited, replaces per_user".
			for _, name := range rule.Replaces {
				sc.replacing = append(sc.replacing, replacer{name: name, by: rule})
			}
			ds.kind = kindRule
			if rule.Unlimited || len(rule.Limits) == 0 {
				ds.kind = kindUnlimited
			}
		}
		sc.descs = append(sc.descs, ds)
	}

	// Pass 2: one limiter request per limit.
	for i := range sc.descs {
		ds := &sc.descs[i]
		d := req.Descriptors[i]
		ds.first = len(sc.reqs)
		hits, refund := defHits, false
		if d.HitsAddend != nil {
			hits = d.HitsAddend.Value
		}
		if d.IsNegativeHits {
			hits, refund = 0, true
		}
		switch ds.kind {
		case kindOverride:
			o := d.Limit
			w, _ := overrideWindow(o) // validate checked that it fits
			lim := limiter.Limit{Requests: uint64(o.RequestsPerUnit), Window: w}
			var fm limiter.FailureMode
			ruleName := overrideName
			if r := ds.rule; r != nil {
				ruleName = r.Name
				if len(r.Limits) > 0 {
					lim.Algorithm = r.Limits[0].Limit.Algorithm
					fm = r.Limits[0].FailureMode
				}
			}
			q := limiter.Request{Limit: lim, Hits: beyond(hits, lim), Shadow: s.shadow || refund, FailureMode: fm}
			blocked := lim.Requests == 0 // as in envoyproxy/ratelimit, and as requests_per_unit: 0 in YAML
			if blocked {
				block(&q)
			}
			if err := descriptors.Countable(q.Limit); err != nil {
				return invalid("descriptors[%d].limit: %v (with the algorithm of the matched rule)", i, err)
			}
			start := len(sc.key)
			sc.key = limiter.AppendKeyPart(sc.key, domain)
			sc.key = limiter.AppendKeyPart(sc.key, "") // no rule has an empty ID
			sc.key = appendEntries(sc.key, d, ds.rule, s.limits.MaxValueBytes)
			sc.reqs = append(sc.reqs, q)
			sc.meta = append(sc.meta, reqMeta{
				desc: i, rule: ds.rule, ruleName: ruleName, name: ruleName,
				unit: rlsv3.RateLimitResponse_RateLimit_Unit(o.Unit), mult: overrideMultiplier(o),
				keyStart: start, keyEnd: len(sc.key), blocked: blocked,
			})
		case kindRule:
			r := ds.rule
			for li := range r.Limits {
				l := &r.Limits[li]
				if l.Named && sc.isReplaced(l.Name, r) {
					continue
				}
				start := len(sc.key)
				sc.key = limiter.AppendKeyPart(sc.key, domain)
				sc.key = limiter.AppendKeyPart(sc.key, l.ID)
				sc.key = appendEntries(sc.key, d, r, s.limits.MaxValueBytes)
				unit, mult := reportedUnit(l)
				q := limiter.Request{
					Limit:       l.Limit,
					Hits:        beyond(hits, l.Limit),
					Shadow:      s.shadow || r.ShadowMode || refund,
					FailureMode: l.FailureMode,
				}
				if l.Blocked() {
					block(&q)
				}
				sc.reqs = append(sc.reqs, q)
				sc.meta = append(sc.meta, reqMeta{
					desc: i, rule: r, ruleName: r.Name, name: l.Name, unit: unit, mult: mult,
					keyStart: start, keyEnd: len(sc.key), blocked: l.Blocked(),
				})
			}
		}
		ds.n = len(sc.reqs) - ds.first
	}
	if len(sc.reqs) == 0 {
		return nil
	}
	// One allocation for every key of the request: the limiter may keep a
	// Key (the memory backend stores it), so it must not alias the pooled
	// buffer.
	all := string(sc.key)
	for k := range sc.reqs {
		sc.reqs[k].Key = all[sc.meta[k].keyStart:sc.meta[k].keyEnd]
	}
	if cap(sc.res) < len(sc.reqs) {
		sc.res = make([]limiter.Result, len(sc.reqs))
	}
	sc.res = sc.res[:len(sc.reqs)]
	clear(sc.res)
	return nil
}

// block makes q the stand-in of a blocked limit (requests_per_unit 0,
// which blocks). Asking for more hits than a one-request limit holds is
// denied by every backend without consuming, so the batch stays
// all-or-nothing and one store call; unblock restores what is reported.
// Without a burst: a token bucket's burst is its capacity, which would hold
// the two hits. The same during an outage: a blocked limit denies whatever
// its failure mode, so it vetoes the fallback's batch as a deny-mode one
// does. As allow, its stand-in would be admitted, and the fallback limits of
// the request would consume for an OVER_LIMIT answer.
func block(q *limiter.Request) {
	q.Limit.Requests, q.Limit.Burst, q.Hits = 1, 0, 2
	if q.FailureMode == limiter.FailAllow {
		q.FailureMode = limiter.FailDeny
	}
}

// beyond returns hits, or one more than l's capacity when hits exceed it:
// every algorithm denies any number of hits beyond the capacity alike,
// consuming nothing, and a descriptor's hits_addend (up to 2^64−1, perhaps
// from a client's header) must not reach a store whose arithmetic is exact
// only below 2^53, which would refuse it and leave the request to Envoy's
// failure mode.
func beyond(hits uint64, l limiter.Limit) uint64 {
	if c := l.Capacity(); hits > c {
		return c + 1
	}
	return hits
}

// unblock restores the reported limit of every blocked limit after Check:
// zero requests, nothing remaining, denied, and Retry-After and reset one
// window, whatever decided the stand-in request. Its result is no answer
// for a blocked limit: during an outage a deny failure mode (which an
// allow one becomes, see plan) denies it for failsoft's DenyRetryAfter, a
// second by default, and the reset a store or fallback reports is that of a
// counter nothing is ever counted in. A blocked limit never opens, so one
// window, as README promises, is the honest hint.
func (sc *scratch) unblock() {
	for k := range sc.meta {
		if sc.meta[k].blocked {
			q, r := &sc.reqs[k], &sc.res[k]
			q.Limit.Requests = 0
			w := q.Limit.Window
			r.Allowed, r.Remaining, r.ResetAfter, r.RetryAfter = false, 0, w, w
		}
	}
}

// isReplaced reports whether another matched rule than owner replaces name.
func (sc *scratch) isReplaced(name string, owner *descriptors.Rule) bool {
	for _, r := range sc.replacing {
		if r.name == name && r.by != owner {
			return true
		}
	}
	return false
}

// appendEntries appends the entries of d that name its counter of rule r
// (nil: none matched): each key and value, or the wildcard a value shares
// its counter with (share_threshold).
func appendEntries(dst []byte, d *ratelimitv3.RateLimitDescriptor, r *descriptors.Rule, maxValue int) []byte {
	for i, e := range d.Entries {
		dst = limiter.AppendKeyPart(dst, e.Key)
		dst = appendValue(dst, r.CounterValue(i, e.Value), maxValue)
	}
	return dst
}

// digestMark starts the key part that stands for a value longer than the
// request limits' MaxValueBytes: the mark and the value's SHA-256. A value
// that starts with the mark is counted by its digest too, however short, so
// no value counted as it is can spell another's digest (anyone can compute
// a long value's digest and send those 40 bytes: they shared its counter).
const digestMark = "\x00sha256:"

// appendValue appends value v as a key part: v itself, or, when it is longer
// than max bytes (or starts with digestMark), its digest. A client's header
// can be as long as Envoy lets it (60 KiB by default); counted by digest,
// each value still has its own counter, and the counter's name stays short.
func appendValue(dst []byte, v string, max int) []byte {
	if len(v) <= max && !strings.HasPrefix(v, digestMark) {
		return limiter.AppendKeyPart(dst, v)
	}
	sum := sha256.Sum256([]byte(v))
	return limiter.AppendKeyPart(dst, digestMark+string(sum[:]))
}
