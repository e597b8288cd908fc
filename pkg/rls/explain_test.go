package rls

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/envoy-rls/envoy-rls/pkg/algorithm"
	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
)

func entries(kv ...string) []descriptors.Entry {
	var es []descriptors.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, descriptors.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

// lineOf is the 1-based line of the first line of text containing s.
func lineOf(t *testing.T, text, s string) int {
	t.Helper()
	for i, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return i + 1
		}
	}
	t.Fatalf("%q not in the config", s)
	return 0
}

func checkExplained(t *testing.T, what string, got ExplainedLimit, l descriptors.Limit, want algorithm.Decision) {
	t.Helper()
	if got.ID != l.ID || got.Name != l.Name || got.Requests != l.Limit.Requests || got.WindowMS != l.Limit.Window.Milliseconds() ||
		got.Algorithm != l.Limit.Algorithm.String() || got.FailureMode != l.FailureMode.String() || got.Position != l.Pos.String() {
		t.Errorf("%s: limit %+v does not describe %+v", what, got, l)
	}
	if got.Allowed != want.Allowed || got.Remaining != want.Remaining ||
		got.ResetAfterMS != want.ResetAfter.Milliseconds() || got.RetryAfterMS != want.RetryAfter.Milliseconds() {
		t.Errorf("%s: counter %+v, want %+v", what, got, want)
	}
	if got.Source != "store" {
		t.Errorf("%s: source %q", what, got.Source)
	}
}

// TestExplainCountsNothing steps through time, explaining the two-limit
// descriptor before every real request: Explain agrees with the model's
// check of one hit, and the real request that follows agrees with a model
// that never saw the explains.
func TestExplainCountsNothing(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	cfg := e.svc.cfg.Current()
	burst := limitOf(t, cfg, "test", "burst", "multi", "m")
	hourly := limitOf(t, cfg, "test", "hourly", "multi", "m")
	m := newModel(e.clock)
	for i, at := range []time.Duration{0, time.Second, 2 * time.Second, 10 * time.Second, 11 * time.Second, 21 * time.Second} {
		e.clock.Set(t0.Add(at))
		what := fmt.Sprintf("step %d at +%v", i, at)
		for range 3 { // explaining repeatedly changes nothing either
			ex, err := e.svc.Explain(context.Background(), "test", entries("multi", "m"))
			if err != nil {
				t.Fatal(err)
			}
			want := m.batch(mreq{"burst", burst.Limit, 0, false}, mreq{"hourly", hourly.Limit, 0, false})
			if ex.Rule == nil || ex.Rule.Name != "multi" || ex.Rule.ID != "multi" || len(ex.Limits) != 2 {
				t.Fatalf("%s: %+v", what, ex)
			}
			checkExplained(t, what+" burst", ex.Limits[0], burst, want[0])
			checkExplained(t, what+" hourly", ex.Limits[1], hourly, want[1])
			wantCode := "OK"
			if !want[0].Allowed || !want[1].Allowed {
				wantCode = "OVER_LIMIT"
			}
			if ex.Code != wantCode {
				t.Errorf("%s: code %s, want %s", what, ex.Code, wantCode)
			}
		}
		d := m.batch(mreq{"burst", burst.Limit, 1, false}, mreq{"hourly", hourly.Limit, 1, false})
		resp := e.must(request("test", desc("multi", "m")))
		wantCode := rlsv3.RateLimitResponse_OK
		if !d[0].Allowed || !d[1].Allowed {
			wantCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.OverallCode != wantCode {
			t.Errorf("%s: real request %v, want %v", what, resp.OverallCode, wantCode)
		}
	}
	// Explain reports no decisions to the Observer.
	for _, d := range e.obs.take() {
		if d.Rule != "multi" {
			t.Errorf("observed %+v", d)
		}
	}
}

func TestExplainRuleDetails(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	ex, err := e.svc.Explain(context.Background(), "test", entries("tenant", "acme", "plan", "gold"))
	if err != nil {
		t.Fatal(err)
	}
	r := ex.Rule
	wantPos := fmt.Sprintf("test.yaml:%d:", lineOf(t, testYAML, "- key: plan"))
	if r == nil || r.Name != "gold_plan" || r.ID != "tenant.plan=gold" || !slices.Equal(r.Replaces, []string{"per_tenant"}) ||
		!strings.Contains(r.Position, wantPos) {
		t.Errorf("rule %+v, want gold_plan at %s…", r, wantPos)
	}
	if len(ex.Limits) != 1 || !strings.Contains(ex.Limits[0].Position, fmt.Sprintf("test.yaml:%d:", lineOf(t, testYAML, "name: gold_plan"))) {
		t.Errorf("limits %+v", ex.Limits)
	}
	if ex.Limits[0].Unit != "minute" || !ex.Limits[0].Allowed || ex.Limits[0].Remaining != 10 || ex.Code != "OK" || !ex.KnownDomain {
		t.Errorf("explanation %+v", ex)
	}
	if ex.ConfigDigest != e.svc.cfg.Current().Digest() {
		t.Errorf("digest %q", ex.ConfigDigest)
	}

	// Shadow: reported as shadow, and a denial does not make it OVER_LIMIT.
	e.must(request("test", desc("shadowed", "s")))
	ex, err = e.svc.Explain(context.Background(), "test", entries("shadowed", "s"))
	if err != nil {
		t.Fatal(err)
	}
	if !ex.Rule.ShadowMode || !ex.Limits[0].Shadow || ex.Limits[0].Allowed || ex.Code != "OK" || ex.Limits[0].RetryAfterMS <= 0 {
		t.Errorf("shadow explanation %+v %+v", ex.Rule, ex.Limits)
	}

	// Unlimited, no rule, unknown domain: no limits, OK.
	for _, tc := range []struct {
		domain string
		kv     []string
		rule   string
		known  bool
	}{
		{"test", []string{"free", "x"}, "free", true},
		{"test", []string{"nomatch", "y"}, "", true},
		{"elsewhere", []string{"user", "u"}, "", false},
	} {
		ex, err := e.svc.Explain(context.Background(), tc.domain, entries(tc.kv...))
		if err != nil {
			t.Fatal(err)
		}
		gotRule := ""
		if ex.Rule != nil {
			gotRule = ex.Rule.Name
			if !ex.Rule.Unlimited {
				t.Errorf("%v: rule %+v is not unlimited", tc.kv, ex.Rule)
			}
		}
		if gotRule != tc.rule || ex.KnownDomain != tc.known || len(ex.Limits) != 0 || ex.Code != "OK" {
			t.Errorf("%v: %+v", tc.kv, ex)
		}
	}
}

func TestExplainGlobalShadowAndBlocked(t *testing.T) {
	files := map[string]string{"b.yaml": `
domain: b
descriptors:
  - key: banned
    rate_limit: {name: banned, unit: minute, requests_per_unit: 0}
`}
	e := newEnv(t, files, Options{Shadow: true})
	ex, err := e.svc.Explain(context.Background(), "b", entries("banned", "x"))
	if err != nil {
		t.Fatal(err)
	}
	l := ex.Limits[0]
	if !l.Blocked || l.Allowed || l.Remaining != 0 || l.RetryAfterMS != time.Minute.Milliseconds() || l.ResetAfterMS != time.Minute.Milliseconds() || !l.Shadow || ex.Code != "OK" {
		t.Errorf("blocked in global shadow: %+v, code %s", l, ex.Code)
	}
	var b strings.Builder
	if err := FormatExplanation(&b, ex); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"domain b, descriptor banned=x: OK", "rule banned (id banned) at", "blocked", "0/1m0s"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text form lacks %q:\n%s", want, b.String())
		}
	}
}

func TestExplainErrors(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	for _, tc := range []struct {
		domain  string
		entries []descriptors.Entry
		want    string
	}{
		{"", entries("user", "u"), "domain: must not be empty"},
		{"test", nil, "entries: must not be empty"},
		{"test", entries("", "u"), "entries[0].key: must not be empty"},
		{"test", entries(strings.Repeat("k", DefaultMaxKeyBytes+1), "v"), "entries[0].key"},
		{"test", entries("\xff", "v"), "invalid UTF-8"},
	} {
		_, err := e.svc.Explain(context.Background(), tc.domain, tc.entries)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Explain(%q, %v) = %v, want InvalidArgument %q", tc.domain, tc.entries, err, tc.want)
		}
	}
	svc, err := New(Options{Config: staticConfig{}, Limiter: e.backend})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Explain(context.Background(), "test", entries("user", "u")); status.Code(err) != codes.Unavailable {
		t.Errorf("without a config: %v, want Unavailable", err)
	}
}

// denyRecorder is an Observer that also implements DenyObserver.
type denyRecorder struct {
	recorder
	mu     sync.Mutex
	denies []string // "outcome rule k=v,k=v"
}

func (r *denyRecorder) ObserveDeny(d Decision, es []descriptors.Entry) {
	kv := make([]string, len(es))
	for i, e := range es {
		kv[i] = e.Key + "=" + e.Value
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.denies = append(r.denies, fmt.Sprintf("%s %s %s", d.Outcome, d.Rule, strings.Join(kv, ",")))
}

func TestDenyObserver(t *testing.T) {
	e := newEnv(t, testFiles, Options{})
	obs := &denyRecorder{}
	svc, err := New(Options{Config: e.svc.cfg, Limiter: e.backend, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	call := func(ds ...[]string) rlsv3.RateLimitResponse_Code {
		req := request("test")
		for _, kv := range ds {
			req.Descriptors = append(req.Descriptors, desc(kv...))
		}
		resp, err := svc.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode
	}
	var want []string
	for i := range 7 {
		code := call([]string{"free", "x"}, []string{"user", "bob"})
		if i >= 5 { // per_user admits 5 a minute
			want = append(want, "over_limit per_user user=bob")
			if code != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("request %d: %v", i, code)
			}
		}
	}
	call([]string{"shadowed", "s"})
	call([]string{"shadowed", "s"})
	want = append(want, "shadow_over_limit shadow_rule shadowed=s")
	if !slices.Equal(obs.denies, want) {
		t.Errorf("denies %q, want %q", obs.denies, want)
	}
	var over int
	for _, d := range obs.take() {
		if d.Outcome == OutcomeOverLimit || d.Outcome == OutcomeShadowOverLimit {
			over++
		}
	}
	if over != len(obs.denies) {
		t.Errorf("%d denial decisions, %d ObserveDeny calls", over, len(obs.denies))
	}
}
