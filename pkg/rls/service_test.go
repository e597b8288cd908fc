package rls

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoy-rls/envoy-rls/internal/logevery"
	"github.com/envoy-rls/envoy-rls/pkg/algorithm"
	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
	"github.com/envoy-rls/envoy-rls/pkg/failsoft"
	"github.com/envoy-rls/envoy-rls/pkg/limiter"
	"github.com/envoy-rls/envoy-rls/pkg/limiter/limitertest"
	"github.com/envoy-rls/envoy-rls/pkg/memorybackend"
)

// testYAML is the descriptor configuration most tests use. Most limits are
// fixed windows so that the model below is easy to follow, but the model is
// the real pkg/algorithm, so any algorithm works.
const testYAML = `
domain: test
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 5, algorithm: fixed_window}
  - key: tenant
    rate_limit: {name: per_tenant, unit: minute, requests_per_unit: 3, algorithm: fixed_window}
    descriptors:
      - key: plan
        value: gold
        rate_limit:
          name: gold_plan
          unit: minute
          requests_per_unit: 10
          algorithm: fixed_window
          replaces: [{name: per_tenant}]
  - key: free
    rate_limit: {unlimited: true}
  - key: shadowed
    shadow_mode: true
    rate_limit: {name: shadow_rule, unit: minute, requests_per_unit: 1, algorithm: fixed_window}
  - key: multi
    rate_limits:
      - {name: burst, window: 10s, requests_per_unit: 2, algorithm: fixed_window}
      - {name: hourly, unit: hour, requests_per_unit: 3, algorithm: fixed_window}
  - key: odd
    rate_limit: {name: odd_window, window: 1500ms, requests_per_unit: 1, algorithm: fixed_window}
  - key: ninety
    rate_limit: {name: ninety, window: 90s, requests_per_unit: 1}
  - key: slow
    rate_limit: {name: slow, window: 10s, requests_per_unit: 1, algorithm: fixed_window}
  - key: bucket
    rate_limit: {name: bucket, unit: second, requests_per_unit: 2, burst: 4, algorithm: token_bucket}
`

var testFiles = map[string]string{"test.yaml": testYAML}

// model is the reference the tests compare the service with: the shared
// limitertest.Model (pkg/algorithm with the batch semantics of
// limiter.Limiter) on the test's clock.
type model struct {
	m   *limitertest.Model
	now func() int64
}

func newModel(c *clock) *model {
	return &model{m: limitertest.NewModel(), now: func() int64 { return c.ms.Load() }}
}

type mreq struct {
	counter string // the test's name for the counter
	limit   limiter.Limit
	hits    uint64
	shadow  bool
}

func (m *model) batch(reqs ...mreq) []algorithm.Decision {
	lreqs := make([]limiter.Request, len(reqs))
	for i, r := range reqs {
		lreqs[i] = limiter.Request{Key: r.counter, Limit: r.limit, Hits: r.hits, Shadow: r.shadow}
	}
	res, _ := m.m.Check(m.now(), lreqs, false)
	out := make([]algorithm.Decision, len(res))
	for i, r := range res {
		out[i] = algorithm.Decision{Allowed: r.Allowed, Remaining: r.Remaining, ResetAfter: r.ResetAfter, RetryAfter: r.RetryAfter}
	}
	return out
}

// limitOf returns the compiled limit named name of the rule matching kv.
func limitOf(t *testing.T, cfg *descriptors.Config, domain, name string, kv ...string) descriptors.Limit {
	t.Helper()
	var es []descriptors.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, descriptors.Entry{Key: kv[i], Value: kv[i+1]})
	}
	r := cfg.Match(domain, es)
	if r == nil {
		t.Fatalf("no rule matches %v", kv)
	}
	for _, l := range r.Limits {
		if l.Name == name {
			return l
		}
	}
	t.Fatalf("rule %s has no limit %q", r.ID, name)
	return descriptors.Limit{}
}

// checkStatus compares a descriptor status with the model's decision for l.
func checkStatus(t *testing.T, what string, st *rlsv3.RateLimitResponse_DescriptorStatus, wantCode rlsv3.RateLimitResponse_Code, l descriptors.Limit, d algorithm.Decision) {
	t.Helper()
	if st.Code != wantCode {
		t.Errorf("%s: code %v, want %v", what, st.Code, wantCode)
	}
	cl := st.CurrentLimit
	if cl == nil {
		t.Fatalf("%s: no current_limit", what)
	}
	unit, mult := reportedUnit(&l)
	if cl.Name != l.Name || uint64(cl.RequestsPerUnit) != l.Limit.Requests || cl.Unit != unit || cl.GetUnitMultiplier().GetValue() != map[bool]uint32{true: mult, false: 0}[mult > 1] {
		t.Errorf("%s: current_limit %v, want %s %d/%v×%d", what, cl, l.Name, l.Limit.Requests, unit, mult)
	}
	if uint64(st.LimitRemaining) != d.Remaining {
		t.Errorf("%s: remaining %d, want %d", what, st.LimitRemaining, d.Remaining)
	}
	if got := st.DurationUntilReset.AsDuration(); got != d.ResetAfter {
		t.Errorf("%s: reset %v, want %v", what, got, d.ResetAfter)
	}
}

func TestValidationRejectsAndCountsNothing(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	cfg := e.svc.cfg.Current()
	perUser := limitOf(t, cfg, "test", "per_user", "user", "alice")
	alice := func() *commonv3.RateLimitDescriptor { return desc("user", "alice") }
	many := func(n int) []*commonv3.RateLimitDescriptor {
		ds := make([]*commonv3.RateLimitDescriptor, n)
		for i := range ds {
			ds[i] = alice()
		}
		return ds
	}
	manyEntries := desc()
	for i := range DefaultMaxEntries + 1 {
		manyEntries.Entries = append(manyEntries.Entries, &commonv3.RateLimitDescriptor_Entry{Key: "k" + strconv.Itoa(i), Value: "v"})
	}
	override := func(o *commonv3.RateLimitDescriptor_RateLimitOverride) *commonv3.RateLimitDescriptor {
		d := alice()
		d.Limit = o
		return d
	}
	cases := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string // the message must start with it
	}{
		{"empty domain", request("", alice()), "domain: must not be empty"},
		{"no descriptors", request("test"), "descriptors: must not be empty"},
		{"descriptor without entries", request("test", alice(), desc()), "descriptors[1].entries: must not be empty"},
		{"empty key", request("test", alice(), desc("", "x")), "descriptors[1].entries[0].key: must not be empty"},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "test", Descriptors: many(DefaultMaxDescriptors + 1)}, "descriptors: 65 descriptors exceed the maximum of 64"},
		{"too many entries", request("test", alice(), manyEntries), "descriptors[1].entries: 17 entries exceed the maximum of 16"},
		{"long domain", request(strings.Repeat("d", DefaultMaxDomainBytes+1), alice()), "domain: 257 bytes exceed the maximum of 256"},
		{"long key", request("test", alice(), desc(strings.Repeat("k", DefaultMaxKeyBytes+1), "v")), "descriptors[1].entries[0].key: 257 bytes exceed"},
		{"override without unit", request("test", alice(), override(&commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3})), "descriptors[1].limit.unit: UNKNOWN is not a known unit"},
		{"override with unknown unit", request("test", override(&commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: 42})), "descriptors[0].limit.unit: 42 is not a known unit"},
		{"override multiplier 0", request("test", override(&commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(0)})), "descriptors[0].limit.unit_multiplier: must be positive"},
	}
	for _, c := range cases {
		_, err := e.call(c.req)
		if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(errMessage(err), c.want) {
			t.Errorf("%s: got %v, want InvalidArgument %q", c.name, err, c.want)
		}
	}

	// Strings that are not UTF-8 cannot be sent by the standard encoder:
	// encode placeholders of the same length and swap the bytes.
	const bad = "\xff\xfe"
	raw := func(req *rlsv3.RateLimitRequest) []byte {
		b, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		return bytes.ReplaceAll(b, []byte("@@"), []byte(bad))
	}
	rawCases := []struct {
		name string
		b    []byte
		want string
	}{
		{"invalid UTF-8 domain", raw(request("te@@st", alice())), "domain: invalid UTF-8"},
		{"invalid UTF-8 key", raw(request("test", alice(), desc("u@@", "v"))), "descriptors[1].entries[0].key: invalid UTF-8"},
		{"truncated protobuf", raw(request("test", alice()))[:7], "request: malformed protobuf"},
	}
	for _, c := range rawCases {
		_, err := e.callRaw(c.b)
		if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(errMessage(err), c.want) {
			t.Errorf("%s: got %v, want InvalidArgument %q", c.name, err, c.want)
		}
	}
	// The raw path decodes valid requests as usual.
	resp, err := e.callRaw(raw(request("test", alice())))
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("raw valid request: %v, %v", resp, err)
	}

	// Nothing above was counted but that last valid request.
	m := newModel(e.clock)
	m.batch(mreq{"alice", perUser.Limit, 1, false})
	want := m.batch(mreq{"alice", perUser.Limit, 1, false})
	resp = e.must(request("test", alice()))
	checkStatus(t, "after the invalid requests", resp.Statuses[0], rlsv3.RateLimitResponse_OK, perUser, want[0])
}

func TestValidationHonoursConfiguredLimits(t *testing.T) {
	e := newEnv(t, testFiles, Options{Limits: RequestLimits{MaxDescriptors: 2, MaxEntries: 1, MaxValueBytes: 4}})
	for _, c := range []struct {
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{request("test", desc("user", "a"), desc("user", "b"), desc("user", "c")), "descriptors: 3 descriptors exceed the maximum of 2"},
		{request("test", desc("tenant", "a", "plan", "gold")), "descriptors[0].entries: 2 entries exceed the maximum of 1"},
	} {
		if _, err := e.call(c.req); status.Code(err) != codes.InvalidArgument || errMessage(err) != c.want {
			t.Errorf("got %v, want InvalidArgument %q", err, c.want)
		}
	}
	if resp := e.must(request("test", desc("user", "abcd"))); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("request within the limits: %v", resp)
	}
}

// largestRequest is the largest request within lim (its defaults filled
// in) whose values are at most MaxValueBytes long: every field at its
// longest, every number at its largest.
func largestRequest(lim RequestLimits) *rlsv3.RateLimitRequest {
	ds := make([]*commonv3.RateLimitDescriptor, lim.MaxDescriptors)
	for i := range ds {
		d := &commonv3.RateLimitDescriptor{
			Limit: &commonv3.RateLimitDescriptor_RateLimitOverride{
				RequestsPerUnit: math.MaxUint32, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(math.MaxUint32)},
			HitsAddend:     wrapperspb.UInt64(math.MaxUint64),
			IsNegativeHits: true,
		}
		for range lim.MaxEntries {
			d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{
				Key: strings.Repeat("k", lim.MaxKeyBytes), Value: strings.Repeat("v", lim.MaxValueBytes)})
		}
		ds[i] = d
	}
	return &rlsv3.RateLimitRequest{Domain: strings.Repeat("d", lim.MaxDomainBytes), HitsAddend: math.MaxUint32, Descriptors: ds}
}

// TestMaxRequestBytesIsTheLargestValidRequest: for the default limits and
// others, MaxRequestBytes is the size of the largest valid request, which
// the server (built as serve builds it) answers; a request one byte longer
// (a value one byte longer: valid, counted under its digest) is refused
// with ResourceExhausted.
func TestMaxRequestBytesIsTheLargestValidRequest(t *testing.T) {
	for _, lim := range []RequestLimits{{}, {MaxDescriptors: 2, MaxEntries: DefaultMaxEntries + 4, MaxDomainBytes: 300, MaxKeyBytes: 3, MaxValueBytes: 20_000}} {
		e := newEnv(t, testFiles, Options{Limits: lim})
		max := e.svc.MaxRequestBytes()
		req := largestRequest(e.svc.limits)
		if size := proto.Size(req); size != max {
			t.Fatalf("%+v: the largest request is %d bytes, MaxRequestBytes %d", lim, size, max)
		}
		if resp, err := e.call(req); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != len(req.Descriptors) {
			t.Errorf("%+v: the largest request answered %v, %d statuses, error %v", lim, resp.GetOverallCode(), len(resp.GetStatuses()), err)
		}
		req.Descriptors[0].Entries[0].Value += "v"
		if size := proto.Size(req); size != max+1 {
			t.Fatalf("%+v: the request one byte longer is %d bytes, want %d", lim, size, max+1)
		}
		if _, err := e.call(req); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("%+v: a request of %d bytes answered %v, want ResourceExhausted", lim, max+1, err)
		}
	}
	if got, want := (&RequestLimits{MaxDescriptors: math.MaxInt, MaxEntries: math.MaxInt, MaxDomainBytes: 1, MaxKeyBytes: math.MaxInt, MaxValueBytes: 1}).maxRequestBytes(), math.MaxInt32; got != want {
		t.Errorf("MaxRequestBytes of limits beyond 2 GiB: %d, want %d", got, want)
	}
}

func TestUnknownDomainIsOKWithoutLimits(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	for range 3 {
		resp := e.must(request("nope", desc("user", "alice"), desc("free", "x")))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Errorf("overall %v", resp.OverallCode)
		}
		for i, st := range resp.Statuses {
			if st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit != nil {
				t.Errorf("status %d: %v", i, st)
			}
		}
		if len(resp.ResponseHeadersToAdd) != 0 || metadataOf(t, resp) != nil {
			t.Errorf("unknown domain answered with headers or metadata: %v", resp)
		}
	}
	e.must(request("other", desc("user", "alice")))
	if got := e.obs.unknown; len(got) != 4 || got[0] != "nope" || got[3] != "other" {
		t.Errorf("Observer.UnknownDomain calls: %q", got)
	}
	if n := strings.Count(e.logs.String(), "domain=nope"); n != 1 {
		t.Errorf("domain nope logged %d times, want once:\n%s", n, e.logs)
	}
	if n := strings.Count(e.logs.String(), "domain=other"); n != 1 {
		t.Errorf("domain other logged %d times, want once", n)
	}
	// An override in an unknown domain is not applied either (incumbent).
	d := desc("user", "alice")
	d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	for range 2 {
		if resp := e.must(request("nope", d)); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
			t.Errorf("override in an unknown domain: %v", resp)
		}
	}
}

// TestUnknownDomainMemoryIsBounded: at most max unknown domains are
// remembered, each logged once; a new one beyond them is not remembered
// (it is logged through the line limiter), and the remembered ones stay
// remembered. The set was cleared when full, so a client cycling through
// max+1 domains cost a log line per request (a review's finding).
func TestUnknownDomainMemoryIsBounded(t *testing.T) {
	u := unknownDomains{max: 3}
	for _, d := range []string{"a", "b", "c"} {
		if got := u.first(d); got != domainNew {
			t.Errorf("%s: %d, want new", d, got)
		}
	}
	for range 3 {
		for _, d := range []string{"a", "b", "c", "d"} {
			want := domainSeen
			if d == "d" {
				want = domainNotRemembered
			}
			if got := u.first(d); got != want {
				t.Errorf("%s: %d, want %d", d, got, want)
			}
		}
	}
	if len(u.seen) != 3 {
		t.Errorf("%d domains remembered, want 3", len(u.seen))
	}
}

func TestHitsAddend(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	l := limitOf(t, e.svc.cfg.Current(), "test", "per_user", "user", "u")
	m := newModel(e.clock)
	withHits := func(d *commonv3.RateLimitDescriptor, h uint64) *commonv3.RateLimitDescriptor {
		d.HitsAddend = wrapperspb.UInt64(h)
		return d
	}
	steps := []struct {
		name     string
		reqHits  uint32
		descHits *uint64
		want     uint64 // hits the model applies
	}{
		{"request-level 0 means 1", 0, nil, 1},
		{"request-level 2", 2, nil, 2},
		{"descriptor 1 overrides request-level 3", 3, ptr(uint64(1)), 1},
		{"descriptor explicit 0 checks only", 3, ptr(uint64(0)), 0},
		{"request-level 1 fills the window", 1, nil, 1},
		{"explicit 0 at the limit is denied and consumes nothing", 0, ptr(uint64(0)), 0},
		{"more than capacity is denied", 0, ptr(uint64(6)), 6},
	}
	for _, s := range steps {
		d := desc("user", "u")
		if s.descHits != nil {
			d = withHits(d, *s.descHits)
		}
		req := request("test", d)
		req.HitsAddend = s.reqHits
		want := m.batch(mreq{"u", l.Limit, s.want, false})[0]
		resp := e.must(req)
		code := rlsv3.RateLimitResponse_OK
		if !want.Allowed {
			code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		checkStatus(t, s.name, resp.Statuses[0], code, l, want)
		if resp.OverallCode != code {
			t.Errorf("%s: overall %v, want %v", s.name, resp.OverallCode, code)
		}
	}
	// The state reached: 5 of 5 consumed, so the window is full.
	if got := m.batch(mreq{"u", l.Limit, 0, false})[0]; got.Remaining != 0 {
		t.Fatalf("model: remaining %d, the steps should fill the window", got.Remaining)
	}
}

func ptr[T any](v T) *T { return &v }

func TestNegativeHitsAreCheckedInShadow(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	l := limitOf(t, e.svc.cfg.Current(), "test", "slow", "slow", "s")
	e.must(request("test", desc("slow", "s"))) // fills the 1-request window
	d := desc("slow", "s")
	d.HitsAddend = wrapperspb.UInt64(1)
	d.IsNegativeHits = true
	resp := e.must(request("test", d))
	m := newModel(e.clock)
	m.batch(mreq{"s", l.Limit, 1, false})
	want := m.batch(mreq{"s", l.Limit, 0, true})[0]
	checkStatus(t, "refund", resp.Statuses[0], rlsv3.RateLimitResponse_OK, l, want)
	if resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("a refund made the answer %v", resp.OverallCode)
	}
}

func TestLimitOverride(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	cfg := e.svc.cfg.Current()
	perUser := limitOf(t, cfg, "test", "per_user", "user", "u")
	m := newModel(e.clock)
	over := func(kv ...string) *commonv3.RateLimitDescriptor {
		d := desc(kv...)
		d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{
			RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(30),
		}
		return d
	}
	// The override keeps the rule's algorithm (fixed_window) and name.
	ol := descriptors.Limit{Name: "per_user", Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 2, Window: 30 * time.Second}}
	for i := range 3 {
		want := m.batch(mreq{"override u", ol.Limit, 1, false})[0]
		resp := e.must(request("test", over("user", "u")))
		code := map[bool]rlsv3.RateLimitResponse_Code{true: rlsv3.RateLimitResponse_OK, false: rlsv3.RateLimitResponse_OVER_LIMIT}[want.Allowed]
		st := resp.Statuses[0]
		if st.Code != code || st.CurrentLimit.GetName() != "per_user" || st.CurrentLimit.GetRequestsPerUnit() != 2 ||
			st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || st.CurrentLimit.GetUnitMultiplier().GetValue() != 30 ||
			uint64(st.LimitRemaining) != want.Remaining || st.DurationUntilReset.AsDuration() != want.ResetAfter {
			t.Errorf("override request %d: %v, want code %v, 2 per 30 SECOND, %+v", i, st, code, want)
		}
	}
	// The rule's own counter was not touched.
	want := m.batch(mreq{"rule u", perUser.Limit, 1, false})[0]
	checkStatus(t, "rule after overrides", e.must(request("test", desc("user", "u"))).Statuses[0], rlsv3.RateLimitResponse_OK, perUser, want)

	// An override applies without a matching rule, and over an unlimited one.
	for _, kv := range [][]string{{"nomatch", "x"}, {"free", "x"}} {
		m := newModel(e.clock)
		noRule := limiter.Limit{Algorithm: limiter.SlidingWindow, Requests: 2, Window: 30 * time.Second}
		for i := range 3 {
			want := m.batch(mreq{"o", noRule, 1, false})[0]
			st := e.must(request("test", over(kv...))).Statuses[0]
			wantName := "override"
			if kv[0] == "free" {
				wantName = "free" // the unlimited rule's name (its ID)
			}
			if (st.Code == rlsv3.RateLimitResponse_OK) != want.Allowed || st.CurrentLimit.GetName() != wantName ||
				uint64(st.LimitRemaining) != want.Remaining {
				t.Errorf("%v request %d: %v, want allowed=%v remaining %d name %s", kv, i, st, want.Allowed, want.Remaining, wantName)
			}
		}
	}
}

func TestShadowRule(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	l := limitOf(t, e.svc.cfg.Current(), "test", "shadow_rule", "shadowed", "s")
	m := newModel(e.clock)
	for i := range 3 {
		want := m.batch(mreq{"s", l.Limit, 1, true})[0]
		resp := e.must(request("test", desc("shadowed", "s")))
		checkStatus(t, fmt.Sprintf("shadow request %d", i), resp.Statuses[0], rlsv3.RateLimitResponse_OK, l, want)
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.ResponseHeadersToAdd) != 0 || resp.RawBody != nil {
			t.Errorf("shadow request %d: %v", i, resp)
		}
		wantOutcome := OutcomeOK
		if !want.Allowed {
			wantOutcome = OutcomeShadowOverLimit
		}
		if md := metadataOf(t, resp).GetFields(); md["decision"].GetStringValue() != wantOutcome.String() {
			t.Errorf("shadow request %d: metadata %v, want decision %v", i, md, wantOutcome)
		}
		if got := e.obs.take(); len(got) != 1 || got[0].Outcome != wantOutcome || got[0].Limit != "shadow_rule" {
			t.Errorf("shadow request %d: observed %+v, want %v", i, got, wantOutcome)
		}
	}
}

// TestShadowDenialDoesNotVeto: in one request, a shadow limit that is over
// its limit neither denies the request nor keeps the enforced limits from
// consuming; the enforced per_user limit alone decides, and counts.
func TestShadowDenialDoesNotVeto(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	cfg := e.svc.cfg.Current()
	shadow := limitOf(t, cfg, "test", "shadow_rule", "shadowed", "s")
	user := limitOf(t, cfg, "test", "per_user", "user", "u")
	m := newModel(e.clock)
	for i := range 7 { // shadow_rule allows 1, per_user 5
		want := m.batch(mreq{"s", shadow.Limit, 1, true}, mreq{"u", user.Limit, 1, false})
		resp := e.must(request("test", desc("shadowed", "s"), desc("user", "u")))
		wantCode := rlsv3.RateLimitResponse_OK
		if !want[1].Allowed {
			wantCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.OverallCode != wantCode {
			t.Fatalf("request %d: overall %v, want %v (shadow allowed %v, per_user allowed %v)",
				i, resp.OverallCode, wantCode, want[0].Allowed, want[1].Allowed)
		}
		checkStatus(t, fmt.Sprintf("request %d shadow", i), resp.Statuses[0], rlsv3.RateLimitResponse_OK, shadow, want[0])
		checkStatus(t, fmt.Sprintf("request %d per_user", i), resp.Statuses[1], wantCode, user, want[1])
		if i >= 1 && want[0].Allowed {
			t.Fatalf("model admitted shadow request %d of a 1-request window", i)
		}
	}
}

func TestGlobalShadow(t *testing.T) {
	e := newEnv(t, testFiles, Options{Shadow: true})
	l := limitOf(t, e.svc.cfg.Current(), "test", "slow", "slow", "s")
	m := newModel(e.clock)
	for i := range 3 {
		want := m.batch(mreq{"s", l.Limit, 1, true})[0]
		resp := e.must(request("test", desc("slow", "s")))
		checkStatus(t, fmt.Sprintf("request %d", i), resp.Statuses[0], rlsv3.RateLimitResponse_OK, l, want)
		if resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Errorf("request %d: overall %v in global shadow mode", i, resp.OverallCode)
		}
		if i > 0 && want.Allowed {
			t.Fatalf("model admitted request %d of a 1-request window", i)
		}
	}
	if got := e.obs.take(); len(got) != 3 || got[2].Outcome != OutcomeShadowOverLimit {
		t.Errorf("observed %+v", got)
	}
}

func TestUnlimitedAndNoRule(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	for range 3 {
		resp := e.must(request("test", desc("free", "x"), desc("nomatch", "y"), desc("user", "u", "extra", "deeper")))
		for i, st := range resp.Statuses {
			if st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit != nil || st.DurationUntilReset != nil {
				t.Errorf("status %d: %v", i, st)
			}
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.ResponseHeadersToAdd) != 0 || metadataOf(t, resp) != nil {
			t.Errorf("response %v", resp)
		}
		got := e.obs.take()
		if len(got) != 3 || got[0].Outcome != OutcomeUnlimited || got[0].Rule != "free" || got[1].Outcome != OutcomeNoRule || got[2].Outcome != OutcomeNoRule {
			t.Errorf("observed %+v", got)
		}
	}
}

func TestReplaces(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	cfg := e.svc.cfg.Current()
	perTenant := limitOf(t, cfg, "test", "per_tenant", "tenant", "acme")
	gold := limitOf(t, cfg, "test", "gold_plan", "tenant", "acme", "plan", "gold")
	m := newModel(e.clock)
	// With the gold descriptor in the request, per_tenant (3/min) is
	// replaced: 5 requests pass and only gold_plan counts.
	for i := range 5 {
		resp := e.must(request("test", desc("tenant", "acme"), desc("tenant", "acme", "plan", "gold")))
		want := m.batch(mreq{"gold", gold.Limit, 1, false})[0]
		if st := resp.Statuses[0]; st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit != nil {
			t.Errorf("request %d: replaced descriptor status %v, want OK without a limit", i, st)
		}
		checkStatus(t, fmt.Sprintf("request %d gold", i), resp.Statuses[1], rlsv3.RateLimitResponse_OK, gold, want)
	}
	// Without it, per_tenant applies and was never counted above.
	for i := range 4 {
		want := m.batch(mreq{"tenant", perTenant.Limit, 1, false})[0]
		code := map[bool]rlsv3.RateLimitResponse_Code{true: rlsv3.RateLimitResponse_OK, false: rlsv3.RateLimitResponse_OVER_LIMIT}[want.Allowed]
		checkStatus(t, fmt.Sprintf("per_tenant %d", i), e.must(request("test", desc("tenant", "acme"))).Statuses[0], code, perTenant, want)
	}
}

// An unlimited rule's replaces apply, as envoyproxy/ratelimit's: "a VIP
// plan is unlimited and replaces per_user".
func TestUnlimitedReplaces(t *testing.T) {
	e := newEnv(t, map[string]string{"d.yaml": `
domain: d
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 1}
  - key: plan
    value: vip
    rate_limit:
      unlimited: true
      replaces: [{name: per_user}]
`}, Options{})
	for i := range 3 {
		resp := e.must(request("d", desc("user", "bob"), desc("plan", "vip")))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
			t.Errorf("request %d with the vip plan: %v, statuses %v; want OK, per_user replaced", i, resp.OverallCode, resp.Statuses)
		}
	}
	// Without the plan, per_user applies, and the vip requests consumed
	// nothing from it.
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := e.must(request("d", desc("user", "bob"))).OverallCode; got != want {
			t.Errorf("request %d without the plan: %v, want %v", i, got, want)
		}
	}
}

// replaces names a configured name only. An unnamed limit reports its
// rule's ID as its name, but a replaces entry giving that ID (because a
// limit elsewhere is named so) leaves it in place, as envoyproxy/ratelimit
// never replaces an unnamed limit.
func TestReplacesLeavesUnnamedLimits(t *testing.T) {
	e := newEnv(t, map[string]string{"d.yaml": `
domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: client
    rate_limit: {name: remote_address, unit: minute, requests_per_unit: 1}
  - key: partner
    rate_limit:
      unit: minute
      requests_per_unit: 100
      replaces: [{name: remote_address}]
`}, Options{})
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp := e.must(request("d", desc("remote_address", "203.0.113.7"), desc("client", "c"), desc("partner", "p")))
		if resp.OverallCode != want {
			t.Errorf("request %d: %v, want %v (the unnamed remote_address limit applies)", i, resp.OverallCode, want)
		}
		// The named one is replaced: no limit reported for it.
		if st := resp.Statuses[1]; st.CurrentLimit != nil {
			t.Errorf("request %d: the named limit was not replaced: %v", i, st)
		}
	}
}

// A present but empty header reaches the service as an entry with the value
// "" (Envoy's request_headers action). It is matched (key-only rule, or a
// "*" pattern) and counted like any value; refusing the request would let it
// through uncounted on all its descriptors.
func TestEmptyValueIsCounted(t *testing.T) {
	e := newEnv(t, map[string]string{"d.yaml": `
domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: "*"
    rate_limit: {unit: minute, requests_per_unit: 3}
`}, Options{})
	var got []string
	for range 4 {
		resp := e.must(request("d", desc("user", ""), desc("path", "")))
		got = append(got, fmt.Sprintf("%v/%d/%d", resp.OverallCode, resp.Statuses[0].LimitRemaining, resp.Statuses[1].LimitRemaining))
	}
	if want := "[OK/1/2 OK/0/1 OVER_LIMIT/0/1 OVER_LIMIT/0/1]"; fmt.Sprint(got) != want {
		t.Errorf("empty values: %v, want %s", got, want)
	}
	// An empty value is a value of its own: "bob" has its own counter, and
	// the empty one is not shared with the descriptor's other requests.
	if resp := e.must(request("d", desc("user", "bob"))); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 1 {
		t.Errorf("user bob after the empty ones: %v", resp.Statuses[0])
	}
	// The other descriptors of the request are counted (path="" has one
	// left: the denied requests above consumed nothing).
	if resp := e.must(request("d", desc("remote_address", "203.0.113.7"), desc("path", ""))); resp.OverallCode != rlsv3.RateLimitResponse_OK ||
		resp.Statuses[0].LimitRemaining != 0 || resp.Statuses[1].LimitRemaining != 0 {
		t.Errorf("remote_address beside an empty value: %v", resp)
	}
	if resp := e.must(request("d", desc("remote_address", "203.0.113.7"))); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("the address once more: %v, want OVER_LIMIT", resp.OverallCode)
	}
}

// share_threshold (envoyproxy/ratelimit's): every value a wildcard matches
// takes from one counter; without it each value has its own. quota_mode
// counts and never denies, as shadow_mode.
func TestShareThresholdAndQuotaMode(t *testing.T) {
	e := newEnv(t, map[string]string{"d.yaml": `
domain: d
descriptors:
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: tenant
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`}, Options{})
	var shared, apart []rlsv3.RateLimitResponse_Code
	for _, v := range []string{"a", "b", "c"} {
		shared = append(shared, e.must(request("d", desc("path", "/files/"+v))).OverallCode)
		apart = append(apart, e.must(request("d", desc("path", "/api/"+v))).OverallCode)
	}
	if fmt.Sprint(shared) != "[OK OK OVER_LIMIT]" {
		t.Errorf("three values of a shared wildcard of 2/min: %v, want [OK OK OVER_LIMIT]", shared)
	}
	if fmt.Sprint(apart) != "[OK OK OK]" {
		t.Errorf("three values of a wildcard of 2/min each: %v, want [OK OK OK]", apart)
	}
	ex, err := e.svc.Explain(context.Background(), "d", []descriptors.Entry{{Key: "path", Value: "/files/z"}})
	if err != nil || len(ex.Limits) != 1 || ex.Limits[0].Remaining != 0 {
		t.Errorf("explain of another shared value: %+v, %v; want the shared counter, spent", ex, err)
	}
	for i := range 3 {
		resp := e.must(request("d", desc("tenant", "acme")))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Errorf("quota_mode request %d: %v, want OK", i, resp.OverallCode)
		}
		if i > 0 && resp.Statuses[0].LimitRemaining != 0 {
			t.Errorf("quota_mode request %d: remaining %d, want 0 (counted)", i, resp.Statuses[0].LimitRemaining)
		}
	}
}

// A value is often a client's header, which Envoy copies as it came: long,
// or not UTF-8. The request is decided and counted like any other (refusing
// it would let it through uncounted on every descriptor): a long value is
// counted under its digest, with a counter of its own.
func TestClientValuesAreCounted(t *testing.T) {
	e := newEnv(t, map[string]string{"d.yaml": `
domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1}
`}, Options{})
	long := strings.Repeat("t", DefaultMaxValueBytes+1)
	for _, c := range []struct {
		name string
		send func() (*rlsv3.RateLimitResponse, error)
	}{
		{"a long value", func() (*rlsv3.RateLimitResponse, error) {
			return e.call(request("d", desc("remote_address", "203.0.113.7"), desc("tenant", long)))
		}},
		{"another long value", func() (*rlsv3.RateLimitResponse, error) {
			return e.call(request("d", desc("remote_address", "203.0.113.8"), desc("tenant", long[1:]+"u")))
		}},
		{"a value that is not UTF-8", func() (*rlsv3.RateLimitResponse, error) {
			b, err := proto.Marshal(request("d", desc("remote_address", "203.0.113.9"), desc("tenant", "@@")))
			if err != nil {
				return nil, err
			}
			return e.callRaw(bytes.ReplaceAll(b, []byte("@@"), []byte("\xc3\x28")))
		}},
	} {
		var codes []string
		for range 2 {
			resp, err := c.send()
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			codes = append(codes, fmt.Sprintf("%v/%d/%d", resp.OverallCode, resp.Statuses[0].LimitRemaining, resp.Statuses[1].LimitRemaining))
		}
		// Both descriptors counted by the first request; the second is
		// denied by both.
		if want := "[OK/0/0 OVER_LIMIT/0/0]"; fmt.Sprint(codes) != want {
			t.Errorf("%s: %v, want %s", c.name, codes, want)
		}
	}
	// Explain names the long value's counter as a request does.
	ex, err := e.svc.Explain(context.Background(), "d", []descriptors.Entry{{Key: "tenant", Value: long}})
	if err != nil || len(ex.Limits) != 1 || ex.Limits[0].Remaining != 0 {
		t.Errorf("explain of the long value: %+v, %v", ex, err)
	}
	// A short value spelling the long one's digest has a counter of its
	// own: it shared the long value's once (a review's finding; anyone can
	// compute the digest of a value).
	sum := sha256.Sum256([]byte(long))
	forged := digestMark + string(sum[:])
	placeholder := strings.Repeat("@", len(forged))
	b, err := proto.Marshal(request("d", desc("remote_address", "203.0.113.10"), desc("tenant", placeholder)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := e.callRaw(bytes.Replace(b, []byte(placeholder), []byte(forged), 1))
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("a short value spelling the long value's digest: %v, %v; want OK, a counter of its own", resp, err)
	}
}

func TestSeveralLimitsPerDescriptor(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	cfg := e.svc.cfg.Current()
	burst := limitOf(t, cfg, "test", "burst", "multi", "m")
	hourly := limitOf(t, cfg, "test", "hourly", "multi", "m")
	m := newModel(e.clock)
	// Step through time: two requests per 10 s burst window, three per hour.
	for i, at := range []time.Duration{0, time.Second, 2 * time.Second, 10 * time.Second, 11 * time.Second, 21 * time.Second} {
		e.clock.Set(t0.Add(at))
		d := m.batch(mreq{"burst", burst.Limit, 1, false}, mreq{"hourly", hourly.Limit, 1, false})
		resp := e.must(request("test", desc("multi", "m")))
		// The model picks the most restrictive: a denial (longest
		// retry) first, else the fewest remaining.
		l, want := burst, d[0]
		switch {
		case !d[0].Allowed && !d[1].Allowed:
			if d[1].RetryAfter > d[0].RetryAfter {
				l, want = hourly, d[1]
			}
		case !d[1].Allowed:
			l, want = hourly, d[1]
		case d[0].Allowed && d[1].Remaining < d[0].Remaining:
			l, want = hourly, d[1]
		}
		code := rlsv3.RateLimitResponse_OK
		if !d[0].Allowed || !d[1].Allowed {
			code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		checkStatus(t, fmt.Sprintf("request %d at +%v", i, at), resp.Statuses[0], code, l, want)
		if resp.OverallCode != code {
			t.Errorf("request %d: overall %v, want %v", i, resp.OverallCode, code)
		}
	}
}

func TestStatusesInOrder(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	cfg := e.svc.cfg.Current()
	perUser := limitOf(t, cfg, "test", "per_user", "user", "u")
	slow := limitOf(t, cfg, "test", "slow", "slow", "s")
	ninety := limitOf(t, cfg, "test", "ninety", "ninety", "n")
	bucket := limitOf(t, cfg, "test", "bucket", "bucket", "b")
	m := newModel(e.clock)
	e.clock.Set(t0.Add(1234 * time.Millisecond))
	req := request("test", desc("user", "u"), desc("nomatch", "x"), desc("slow", "s"), desc("user", "u"), desc("ninety", "n"), desc("bucket", "b"))
	req.HitsAddend = 1
	want := m.batch(
		mreq{"u", perUser.Limit, 1, false},
		mreq{"s", slow.Limit, 1, false},
		mreq{"u", perUser.Limit, 1, false}, // the same counter twice counts twice
		mreq{"n", ninety.Limit, 1, false},
		mreq{"b", bucket.Limit, 1, false},
	)
	resp := e.must(req)
	checkStatus(t, "0", resp.Statuses[0], rlsv3.RateLimitResponse_OK, perUser, want[0])
	if st := resp.Statuses[1]; st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit != nil {
		t.Errorf("1: %v", st)
	}
	checkStatus(t, "2", resp.Statuses[2], rlsv3.RateLimitResponse_OK, slow, want[1])
	checkStatus(t, "3", resp.Statuses[3], rlsv3.RateLimitResponse_OK, perUser, want[2])
	checkStatus(t, "4", resp.Statuses[4], rlsv3.RateLimitResponse_OK, ninety, want[3])
	checkStatus(t, "5", resp.Statuses[5], rlsv3.RateLimitResponse_OK, bucket, want[4])
	if want[0].Remaining == want[2].Remaining {
		t.Errorf("the model did not count the repeated descriptor twice: %+v", want)
	}
	// Arbitrary windows are reported as multiples of a unit.
	if cl := resp.Statuses[4].CurrentLimit; cl.Unit != rlsv3.RateLimitResponse_RateLimit_SECOND || cl.GetUnitMultiplier().GetValue() != 90 {
		t.Errorf("90s window reported as %v", cl)
	}
	if cl := resp.Statuses[0].CurrentLimit; cl.Unit != rlsv3.RateLimitResponse_RateLimit_MINUTE || cl.UnitMultiplier != nil {
		t.Errorf("unit minute reported as %v", cl)
	}
}

func TestReportedUnit(t *testing.T) {
	for _, c := range []struct {
		unit   string
		window time.Duration
		want   rlsv3.RateLimitResponse_RateLimit_Unit
		mult   uint32
	}{
		{"minute", time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE, 1},
		{"week", 7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK, 1},
		{"month", 30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH, 1},
		{"year", 365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR, 1},
		{"", time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 1},
		{"", 90 * time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 90},
		{"", 2 * time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR, 2},
		{"", 36 * time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR, 36},
		{"", 48 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY, 2},
		{"", 1500 * time.Millisecond, rlsv3.RateLimitResponse_RateLimit_SECOND, 2},
		{"", 200 * time.Millisecond, rlsv3.RateLimitResponse_RateLimit_SECOND, 1},
	} {
		l := descriptors.Limit{Unit: c.unit, Limit: limiter.Limit{Requests: 1, Window: c.window}}
		if u, m := reportedUnit(&l); u != c.want || m != c.mult {
			t.Errorf("%q %v: %v×%d, want %v×%d", c.unit, c.window, u, m, c.want, c.mult)
		}
	}
}

func TestHeaderModes(t *testing.T) {
	for _, mode := range []HeaderMode{HeadersIETF, HeadersDraft03, HeadersNone} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t, testFiles, Options{Headers: mode})
			cfg := e.svc.cfg.Current()
			perUser := limitOf(t, cfg, "test", "per_user", "user", "u")
			slow := limitOf(t, cfg, "test", "slow", "slow", "s")
			m := newModel(e.clock)
			e.clock.Set(t0.Add(2500 * time.Millisecond))
			for i := range 2 {
				d := m.batch(mreq{"u", perUser.Limit, 1, false}, mreq{"s", slow.Limit, 1, false})
				resp := e.must(request("test", desc("user", "u"), desc("slow", "s")))
				// The most restrictive enforced limit: slow (1/10s)
				// has fewer remaining on the first request and
				// denies on the second.
				l, r := slow, d[1]
				want := map[string]string{}
				secs := func(d time.Duration) string { return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10) }
				switch mode {
				case HeadersIETF:
					want["RateLimit-Policy"] = fmt.Sprintf("%q;q=%d;w=%s", l.Name, l.Limit.Requests, secs(l.Limit.Window))
					want["RateLimit"] = fmt.Sprintf("%q;r=%d;t=%s", l.Name, r.Remaining, secs(r.ResetAfter))
				case HeadersDraft03:
					want["X-RateLimit-Limit"] = fmt.Sprintf("%d, %d;w=%s;name=%q", l.Limit.Requests, l.Limit.Requests, secs(l.Limit.Window), l.Name)
					want["X-RateLimit-Remaining"] = strconv.FormatUint(r.Remaining, 10)
					want["X-RateLimit-Reset"] = secs(r.ResetAfter)
				}
				if !r.Allowed {
					want["Retry-After"] = secs(r.RetryAfter) // 7.5 s → 8
					want["Content-Type"] = "application/problem+json"
				}
				got := map[string]string{}
				for _, h := range resp.ResponseHeadersToAdd {
					if _, dup := got[h.Key]; dup {
						t.Errorf("header %s twice", h.Key)
					}
					got[h.Key] = h.Value
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("request %d: headers\n got %v\nwant %v", i, got, want)
				}
				if i == 1 && want["Retry-After"] != "8" {
					t.Errorf("model: Retry-After %q, the test expects a fraction rounded up to 8", want["Retry-After"])
				}
			}
		})
	}
}

// TestHeaderIntegersFitStructuredFields: a structured field's integer has
// at most 15 digits (RFC 8941 §3.3.1), and a parser rejects the whole field
// for a longer one; requests_per_unit and a remaining count may have 16
// (up to 2^53−1). Headers say 999999999999999 for those (a review's
// finding: the limit was written whole).
func TestHeaderIntegersFitStructuredFields(t *testing.T) {
	files := map[string]string{"h.yaml": `
domain: h
descriptors:
  - key: k
    rate_limit: {name: huge, unit: minute, requests_per_unit: 2000000000000000, algorithm: fixed_window}
`}
	for mode, want := range map[HeaderMode]map[string]string{
		HeadersIETF: {
			"RateLimit-Policy": `"huge";q=999999999999999;w=60`,
			"RateLimit":        `"huge";r=999999999999999;t=60`,
		},
		HeadersDraft03: {
			"X-RateLimit-Limit":     `999999999999999, 999999999999999;w=60;name="huge"`,
			"X-RateLimit-Remaining": "999999999999999",
		},
	} {
		e := newEnv(t, files, Options{Headers: mode})
		resp := e.must(request("h", desc("k", "v")))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != math.MaxUint32 {
			t.Fatalf("%v: %v", mode, resp)
		}
		for h, v := range want {
			if got, _ := header(resp, h); got != v {
				t.Errorf("%v: %s: %q, want %q", mode, h, got, v)
			}
		}
	}
}

func TestRetryAfterRoundsUpAndIsAtLeastOne(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	l := limitOf(t, e.svc.cfg.Current(), "test", "odd_window", "odd", "o")
	m := newModel(e.clock)
	// A 1500 ms window entered at 1400 ms: the retry is 100 ms away.
	e.clock.Set(t0.Add(1400 * time.Millisecond))
	for i := range 2 {
		d := m.batch(mreq{"o", l.Limit, 1, false})[0]
		resp := e.must(request("test", desc("odd", "o")))
		got, ok := header(resp, "Retry-After")
		if d.Allowed {
			if ok {
				t.Errorf("request %d admitted with Retry-After %s", i, got)
			}
			continue
		}
		if d.RetryAfter >= time.Second || d.RetryAfter <= 0 {
			t.Fatalf("model: retry %v, the test needs a sub-second wait", d.RetryAfter)
		}
		if got != "1" {
			t.Errorf("Retry-After %q for a %v wait, want 1", got, d.RetryAfter)
		}
		if p, _ := header(resp, "RateLimit-Policy"); p != `"odd_window";q=1;w=2` {
			t.Errorf("policy for a 1500ms window: %q", p)
		}
	}
}

// TestLongestWaits: a token bucket of 1 a year with a burst of 1,000 has
// waits of centuries, which the limiter saturates at the largest Duration
// (about 292 years). The reset, Retry-After and the body's retry_after say
// those 9,223,372,037 seconds, never a negative number nor the one second
// an overflowing round-up once gave (a review's finding).
func TestLongestWaits(t *testing.T) {
	e := newEnv(t, map[string]string{"y.yaml": `
domain: y
descriptors:
  - key: k
    rate_limit: {name: yearly, unit: year, requests_per_unit: 1, burst: 1000, algorithm: token_bucket}
`}, Options{})
	const longest = "9223372037" // math.MaxInt64 ns in whole seconds, rounded up
	d := desc("k", "v")
	d.HitsAddend = wrapperspb.UInt64(1000)
	resp := e.must(request("y", d)) // the whole burst: full again in 1,000 years
	if rl, _ := header(resp, "RateLimit"); resp.OverallCode != rlsv3.RateLimitResponse_OK || rl != `"yearly";r=0;t=`+longest {
		t.Fatalf("first request: %v, RateLimit %q", resp.OverallCode, rl)
	}
	resp = e.must(request("y", d))
	ra, _ := header(resp, "Retry-After")
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || ra != longest {
		t.Fatalf("second request: %v, Retry-After %q, want %s", resp.OverallCode, ra, longest)
	}
	if !strings.Contains(string(resp.RawBody), `"retry_after":`+longest) {
		t.Errorf("body %s: want retry_after %s", resp.RawBody, longest)
	}
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{{0, 0}, {-time.Second, 0}, {1, 1}, {time.Second, 1}, {time.Second + 1, 2}, {math.MaxInt64, 9223372037}} {
		if got := ceilSeconds(c.d); got != c.want {
			t.Errorf("ceilSeconds(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

func TestProblemBody(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	l := limitOf(t, e.svc.cfg.Current(), "test", "slow", "slow", "s")
	m := newModel(e.clock)
	e.clock.Set(t0.Add(3 * time.Second))
	m.batch(mreq{"s", l.Limit, 1, false})
	e.must(request("test", desc("slow", "s")))
	if r := e.must(request("test", desc("user", "u"))); r.RawBody != nil {
		t.Errorf("body on OK: %s", r.RawBody)
	}
	d := m.batch(mreq{"s", l.Limit, 1, false})[0]
	resp := e.must(request("test", desc("slow", "s"), desc("user", "u")))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || d.Allowed {
		t.Fatalf("overall %v, model allowed=%v", resp.OverallCode, d.Allowed)
	}
	var p map[string]any
	if err := json.Unmarshal(resp.RawBody, &p); err != nil {
		t.Fatalf("body %q: %v", resp.RawBody, err)
	}
	retry := float64((d.RetryAfter + time.Second - 1) / time.Second)
	for k, want := range map[string]any{
		"type": "about:blank", "title": "Too Many Requests", "status": 429.0,
		"limit": "slow", "requests": float64(l.Limit.Requests), "window": l.Limit.Window.String(), "retry_after": retry,
	} {
		if p[k] != want {
			t.Errorf("body %s = %v, want %v", k, p[k], want)
		}
	}
	if detail, _ := p["detail"].(string); !strings.Contains(detail, `"slow"`) || !strings.Contains(detail, "retry after") {
		t.Errorf("detail %q", detail)
	}
	if ct, _ := header(resp, "Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q", ct)
	}
	if ra, _ := header(resp, "Retry-After"); ra != strconv.Itoa(int(retry)) {
		t.Errorf("Retry-After %q, body says %v", ra, retry)
	}
}

func TestDynamicMetadata(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	m := newModel(e.clock)
	cfg := e.svc.cfg.Current()
	perUser := limitOf(t, cfg, "test", "per_user", "user", "u")
	slow := limitOf(t, cfg, "test", "slow", "slow", "s")
	rule := cfg.Match("test", []descriptors.Entry{{Key: "slow", Value: "s"}})
	for i := range 2 {
		d := m.batch(mreq{"u", perUser.Limit, 1, false}, mreq{"s", slow.Limit, 1, false})
		resp := e.must(request("test", desc("user", "u"), desc("slow", "s")))
		md := metadataOf(t, resp).GetFields()
		decision := OutcomeOK
		if !d[1].Allowed {
			decision = OutcomeOverLimit
		}
		want := map[string]any{
			"domain": "test", "rule": rule.Name, "rule_id": rule.ID, "limit": "slow",
			"decision": decision.String(), "source": limiter.SourceStore.String(),
			"descriptor": 1.0, "remaining": float64(d[1].Remaining),
		}
		if len(md) != len(want) {
			t.Errorf("request %d: metadata %v", i, md)
		}
		for k, w := range want {
			if got := md[k].AsInterface(); got != w {
				t.Errorf("request %d: metadata %s = %v, want %v", i, k, got, w)
			}
		}
	}
}

func TestOverallCodeIsNeverUnknown(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"user", "tenant", "free", "shadowed", "multi", "odd", "ninety", "slow", "bucket", "nomatch"}
	for i := range 300 {
		var ds []*commonv3.RateLimitDescriptor
		for range 1 + rng.IntN(4) {
			d := desc(keys[rng.IntN(len(keys))], strconv.Itoa(rng.IntN(3)))
			if rng.IntN(5) == 0 {
				d.HitsAddend = wrapperspb.UInt64(uint64(rng.IntN(4)))
			}
			ds = append(ds, d)
		}
		domain := "test"
		if rng.IntN(10) == 0 {
			domain = "elsewhere"
		}
		resp := e.must(request(domain, ds...)) // fails on UNKNOWN
		for j, st := range resp.Statuses {
			if st.Code == rlsv3.RateLimitResponse_UNKNOWN {
				t.Fatalf("request %d status %d UNKNOWN", i, j)
			}
		}
		e.clock.Advance(time.Duration(rng.IntN(3000)) * time.Millisecond)
	}
}

// failing is a Limiter that cannot decide: the store is down and nothing
// falls back.
type failing struct{ err error }

func (f failing) Check(context.Context, []limiter.Request, []limiter.Result) error { return f.err }

func TestLimiterAndConfigErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want codes.Code
	}{
		{fmt.Errorf("redis: %w", limiter.ErrUnavailable), codes.Unavailable},
		{fmt.Errorf("redis: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{errors.New("boom"), codes.Internal},
	} {
		e := newEnv(t, testFiles, Options{Limiter: failing{c.err}})
		if _, err := e.call(request("test", desc("user", "u"))); status.Code(err) != c.want {
			t.Errorf("limiter error %v: got %v, want %v", c.err, err, c.want)
		}
		// Requests that need no limiter call do not fail.
		if resp := e.must(request("test", desc("free", "x"))); resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Errorf("unlimited: %v", resp)
		}
	}
	e := newEnv(t, nil, Options{Config: staticConfig{nil}})
	if _, err := e.call(request("test", desc("user", "u"))); status.Code(err) != codes.Unavailable {
		t.Errorf("no config: %v", err)
	}
}

// failingWith is a Limiter that fails with the error it holds.
type failingWith struct{ err atomic.Pointer[error] }

func (f *failingWith) set(err error) { f.err.Store(&err) }

func (f *failingWith) Check(context.Context, []limiter.Request, []limiter.Result) error {
	return *f.err.Load()
}

// TestLimiterErrorLinesAreBounded: a limiter error can come with every
// request, so the line of each code in each domain is written once per
// interval of Options.Lines, and the next one counts those held back; a
// kind that falls quiet is reported by Flush.
func TestLimiterErrorLinesAreBounded(t *testing.T) {
	lim := &failingWith{}
	var now atomic.Int64
	lines := logevery.New(10*time.Second, func() time.Time { return time.Unix(0, now.Load()) })
	files := map[string]string{"test.yaml": testYAML, "other.yaml": "domain: other\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"}
	e := newEnv(t, files, Options{Limiter: lim, Lines: lines})
	advance := func(d time.Duration) { now.Add(int64(d)) }
	logged := func() []string {
		var out []string
		for _, l := range strings.Split(e.logs.String(), "\n") {
			if strings.Contains(l, "rate limit check failed") {
				out = append(out, l)
			}
		}
		return out
	}
	fail := func(domain string, err error, n int) {
		t.Helper()
		lim.set(err)
		for range n {
			if _, err := e.call(request(domain, desc("user", "u"))); err == nil {
				t.Fatal("a failing limiter's request answered without an error")
			}
		}
	}
	slow := fmt.Errorf("redis: %w", context.DeadlineExceeded)
	fail("test", slow, 5)
	fail("test", errors.New("boom"), 1)
	fail("other", slow, 2)
	advance(9 * time.Second)
	fail("test", slow, 2)
	advance(time.Second)
	fail("test", slow, 1)
	lines.Flush(context.Background()) // other's held line

	got := logged()
	want := []string{
		"domain=test code=DeadlineExceeded",
		"domain=test code=Internal",
		"domain=other code=DeadlineExceeded",
		"domain=test code=DeadlineExceeded",
		`msg="rate limit check failed" kind="code=DeadlineExceeded domain=other" suppressed=1`,
	}
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d (each code in each domain once per interval, then other's flush):\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i, w := range want {
		if !strings.Contains(got[i], w) {
			t.Errorf("line %d: %s; want %s", i, got[i], w)
		}
	}
	for _, i := range []int{0, 1, 2} {
		if strings.Contains(got[i], "suppressed") {
			t.Errorf("a first line says it follows held lines: %s", got[i])
		}
	}
	if !strings.HasSuffix(got[3], " suppressed=6") {
		t.Errorf("the line after the interval: %s; want suppressed=6 (4 + 2 held back)", got[3])
	}
}

func TestInterceptorSeesRequestsAndInvalidUTF8(t *testing.T) {
	var seen []string
	icpt := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		seen = append(seen, req.(*rlsv3.RateLimitRequest).GetDomain())
		return h(ctx, req)
	}
	e := newEnv(t, testFiles, Options{}, grpc.UnaryInterceptor(icpt))
	e.must(request("test", desc("user", "u")))
	b, _ := proto.Marshal(request("test", desc("u@@", "v")))
	_, err := e.callRaw(bytes.ReplaceAll(b, []byte("@@"), []byte("\xc3\x28")))
	if status.Code(err) != codes.InvalidArgument || errMessage(err) != "descriptors[0].entries[0].key: invalid UTF-8" {
		t.Errorf("invalid UTF-8 through an interceptor: %v", err)
	}
	if len(seen) != 2 || seen[0] != "test" {
		t.Errorf("interceptor saw %q", seen)
	}
}

func TestNewAndParseHeaderMode(t *testing.T) {
	for s, want := range map[string]HeaderMode{"": HeadersIETF, "ietf": HeadersIETF, "draft03": HeadersDraft03, "none": HeadersNone} {
		if got, err := ParseHeaderMode(s); err != nil || got != want {
			t.Errorf("ParseHeaderMode(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseHeaderMode("x-ratelimit"); err == nil {
		t.Error("ParseHeaderMode accepted x-ratelimit")
	}
	if _, err := New(Options{Limiter: failing{}}); err == nil {
		t.Error("New without Config succeeded")
	}
	if _, err := New(Options{Config: staticConfig{}}); err == nil {
		t.Error("New without Limiter succeeded")
	}
	if _, err := New(Options{Config: staticConfig{}, Limiter: failing{}, Headers: 7}); err == nil {
		t.Error("New with header mode 7 succeeded")
	}
}

func TestSFString(t *testing.T) {
	if got := string(appendSFString(nil, "a\"b\\c\x01é")); got != `"a\"b\\c???"` {
		t.Errorf("appendSFString = %s", got)
	}
}

// TestBlockedLimit: requests_per_unit: 0, envoyproxy/ratelimit's way to
// block a value, denies every request, reports a limit of 0 and Retry-After
// and duration_until_reset of one window, and consumes nothing from the
// other limits of the request, whatever the blocked limit's algorithm: a
// token bucket's burst, which sets its capacity, does not let the stand-in
// request through either.
func TestBlockedLimit(t *testing.T) {
	for _, blocked := range []string{
		`{unit: minute, requests_per_unit: 0}`,
		`{unit: minute, requests_per_unit: 0, algorithm: fixed_window}`,
		`{unit: minute, requests_per_unit: 0, algorithm: sliding_log}`,
		`{unit: minute, requests_per_unit: 0, algorithm: token_bucket}`,
		`{unit: minute, requests_per_unit: 0, algorithm: token_bucket, burst: 5}`,
	} {
		t.Run(blocked, func(t *testing.T) {
			e := newEnv(t, map[string]string{"b.yaml": `
domain: b
descriptors:
  - key: ip
    value: 50.0.0.5
    rate_limit: ` + blocked + `
  - key: ip
    rate_limit: {name: per_ip, unit: minute, requests_per_unit: 2}
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
`}, Options{})
			checkBlocked(t, e, request("b", desc("ip", "50.0.0.5"), desc("user", "u")))
			checkTwoLeft(t, e, request("b", desc("user", "u")))
		})
	}
}

// checkBlocked sends req, whose first descriptor is blocked (a limit of 0
// requests a minute), three times, and checks each answer: OVER_LIMIT, a
// limit of 0 a minute, nothing remaining, and Retry-After and
// duration_until_reset one window, not the reset of the stand-in's counter
// (the rest of a fixed window, 0 for a token bucket).
func checkBlocked(t *testing.T, e *env, req *rlsv3.RateLimitRequest) {
	t.Helper()
	for i := range 3 {
		resp := e.must(req)
		st := resp.Statuses[0]
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || st.Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
			st.CurrentLimit.GetRequestsPerUnit() != 0 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE ||
			st.LimitRemaining != 0 || st.DurationUntilReset.AsDuration() != time.Minute {
			t.Fatalf("request %d: %v", i, resp)
		}
		if ra, _ := header(resp, "Retry-After"); ra != "60" {
			t.Errorf("request %d: Retry-After %q, want 60", i, ra)
		}
	}
}

// checkTwoLeft checks that req's limit of 2 has both left (the blocked
// requests before consumed nothing from it): two admissions, then a
// denial.
func checkTwoLeft(t *testing.T, e *env, req *rlsv3.RateLimitRequest) {
	t.Helper()
	for i := range 2 {
		if resp := e.must(req); resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d after the blocked ones: %v", i, resp)
		}
	}
	if resp := e.must(req); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("a third request admitted: %v", resp)
	}
}

// TestBlockedOverride: Envoy's limit override of requests_per_unit 0 blocks
// as the YAML's does, as in envoyproxy/ratelimit: OVER_LIMIT with a limit of
// 0 and one window of the override's unit, nothing consumed from the other
// limits of the request, whatever the algorithm of the rule it matched (it
// was once refused as an invalid request, which Envoy admits uncounted
// unless failure_mode_deny is set).
func TestBlockedOverride(t *testing.T) {
	for _, rule := range []string{
		`{unit: second, requests_per_unit: 100}`,
		`{unit: second, requests_per_unit: 100, algorithm: sliding_log}`,
		`{unit: second, requests_per_unit: 100, algorithm: token_bucket, burst: 5}`,
	} {
		t.Run(rule, func(t *testing.T) {
			e := newEnv(t, map[string]string{"b.yaml": `
domain: b
descriptors:
  - key: ip
    rate_limit: ` + rule + `
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
`}, Options{})
			blocked := desc("ip", "50.0.0.5")
			blocked.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_MINUTE}
			checkBlocked(t, e, request("b", blocked, desc("user", "u")))
			checkTwoLeft(t, e, request("b", desc("user", "u")))
		})
	}
}

// TestBlockedLimitDuringOutage: while the store is down, a blocked limit
// denies whatever its failure mode, and the fallback-mode limits of the same
// request consume nothing for that denial (a review's finding: the allowed
// stand-in let the fallback batch commit); it still answers Retry-After and
// duration_until_reset of one window, as README promises and as it does
// while the store is up (a review's finding: the stand-in, sent with the
// deny mode so that it vetoes the fallback's batch, was answered with
// failsoft's DenyRetryAfter of 1 s, which unblock left as it was because it
// corrected only admitted stand-ins).
func TestBlockedLimitDuringOutage(t *testing.T) {
	lim := outage(t)
	for _, mode := range []string{"allow", "deny", "fallback"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, map[string]string{"b.yaml": `
domain: b
descriptors:
  - key: ip
    value: 50.0.0.5
    rate_limit: {unit: minute, requests_per_unit: 0, failure_mode: ` + mode + `}
  - key: ip
    rate_limit: {name: per_ip, unit: minute, requests_per_unit: 1000, failure_mode: allow}
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2, failure_mode: fallback}
`}, Options{Limiter: lim})
			user := "u-" + mode // a fallback counter of its own
			for i := range 3 {
				resp := e.must(request("b", desc("ip", "50.0.0.5"), desc("user", user)))
				st := resp.Statuses[0]
				if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || st.Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
					st.CurrentLimit.GetRequestsPerUnit() != 0 || st.LimitRemaining != 0 {
					t.Fatalf("blocked request %d: %v", i, resp)
				}
				if got := st.DurationUntilReset.AsDuration(); got != time.Minute {
					t.Errorf("blocked request %d: duration_until_reset %v, want one window (1m); response %v", i, got, resp)
				}
				if ra, ok := header(resp, "Retry-After"); ra != "60" {
					t.Errorf("blocked request %d: Retry-After %q (present: %t), want one window (60)", i, ra, ok)
				}
			}
			// The blocked requests consumed nothing from per_user's
			// fallback counter: 2 remain.
			for i := range 2 {
				if resp := e.must(request("b", desc("ip", "50.0.0.6"), desc("user", user))); resp.OverallCode != rlsv3.RateLimitResponse_OK {
					t.Fatalf("unblocked request %d: %v", i, resp)
				}
			}
			if resp := e.must(request("b", desc("user", user))); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("per_user's fallback admitted a third request: %v", resp)
			}
		})
	}
}

// TestAppendValue: a value up to the limit names its counter as it is; a
// longer one by a short digest, one per value.
func TestAppendValue(t *testing.T) {
	short := string(appendValue(nil, "abc", 4))
	if short != string(limiter.AppendKeyPart(nil, "abc")) {
		t.Errorf("short value %q", short)
	}
	a, b := appendValue(nil, strings.Repeat("a", 5000), 4), appendValue(nil, strings.Repeat("a", 4999)+"b", 4)
	if len(a) != 1+len(digestMark)+32 || bytes.Equal(a, b) {
		t.Errorf("long values: %q and %q, want two digests of %d bytes", a, b, len(digestMark)+32)
	}
}

// outage returns a fail-soft limiter whose store always fails (its breaker
// opens at the first failure) and whose fallback is a memory backend, both
// closed when the test ends: the service during a Redis outage.
func outage(t *testing.T) limiter.Limiter {
	t.Helper()
	fallback := memorybackend.New(memorybackend.Options{SweepInterval: -1})
	t.Cleanup(func() { fallback.Close() })
	lim, err := failsoft.New(failsoft.Options{
		Primary:  failing{fmt.Errorf("redis: %w", limiter.ErrUnavailable)},
		Fallback: fallback,
		Breaker:  failsoft.BreakerOptions{ConsecutiveFailures: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	return lim
}
