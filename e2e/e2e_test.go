package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/envoy-rls/envoy-rls/internal/testenv"
)

// The limits of e2e/testdata/config/edge.yaml the tests exhaust.
const (
	perIP     = 10 // per_ip, per minute
	perTenant = 3  // per_tenant, per minute
	perUser   = 2  // per_user_burst, token bucket, burst 2 per hour
	expensive = 2  // expensive_per_ip, per minute, failure_mode deny
)

// stack is Redis, one envoy-rls on it and one Envoy in front, all on
// loopback, stopped when the test ends.
type stack struct {
	Redis *testenv.Redis
	RLS   *rls
	Envoy *envoy
}

func startStack(t *testing.T, o rlsOptions) *stack {
	t.Helper()
	s := &stack{Redis: testenv.RedisServer(t)}
	o.Redis = s.Redis.Addr
	s.RLS = startRLS(t, o)
	s.Envoy = startEnvoy(t, s.RLS.GRPCAddr)
	return s
}

// reply is one HTTP response through Envoy.
type reply struct {
	Status int
	Header http.Header
	Body   string
}

func (r reply) String() string { return fmt.Sprintf("%d %v %q", r.Status, r.Header, r.Body) }

// get sends GET base+path with the given headers (name, value, ...).
func get(t *testing.T, base, path string, headers ...string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", path, err)
	}
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}
}

// headerInt returns the integer value of header name, failing the test when
// it is missing or not an integer.
func headerInt(t *testing.T, r reply, name string) int {
	t.Helper()
	v := r.Header.Get(name)
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("header %s = %q, want an integer; response %v", name, v, r)
	}
	return n
}

// firstLimit returns the first value of x-ratelimit-limit: the limit of the
// descriptor closest to its limit (Envoy's choice among the statuses).
func firstLimit(r reply) string {
	v, _, _ := strings.Cut(r.Header.Get("X-Ratelimit-Limit"), ",")
	return v
}

// problem is the RFC 9457 body envoy-rls returns as raw_body.
type problem struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail"`
	Limit      string `json:"limit"`
	Requests   int    `json:"requests"`
	RetryAfter int    `json:"retry_after"`
}

var rateLimitFieldRE = regexp.MustCompile(`^"([^"]+)";r=(\d+);t=(\d+)$`)

// checkOK checks a 200 that passed the rule named rule (limit, remaining).
func checkOK(t *testing.T, r reply, rule string, limit, remaining int) {
	t.Helper()
	if r.Status != http.StatusOK || r.Body != "ok\n" {
		t.Fatalf("want 200 ok, got %v", r)
	}
	if got := firstLimit(r); got != strconv.Itoa(limit) {
		t.Errorf("x-ratelimit-limit %q: first value %s, want %d (%s)", r.Header.Get("X-Ratelimit-Limit"), got, limit, rule)
	}
	if got := headerInt(t, r, "X-Ratelimit-Remaining"); got != remaining {
		t.Errorf("x-ratelimit-remaining = %d, want %d", got, remaining)
	}
	m := rateLimitFieldRE.FindStringSubmatch(r.Header.Get("RateLimit"))
	if m == nil || m[1] != rule || m[2] != strconv.Itoa(remaining) {
		t.Errorf("RateLimit = %q, want \"%s\";r=%d;t=<seconds>", r.Header.Get("RateLimit"), rule, remaining)
	}
	if r.Header.Get("X-Envoy-Ratelimited") != "" {
		t.Errorf("x-envoy-ratelimited on a 200: %v", r)
	}
}

// checkLimited checks a 429 from rule and returns its problem body.
func checkLimited(t *testing.T, r reply, rule string, limit int) problem {
	t.Helper()
	if r.Status != http.StatusTooManyRequests {
		t.Fatalf("want 429, got %v", r)
	}
	if got := r.Header.Get("X-Envoy-Ratelimited"); got != "true" {
		t.Errorf("x-envoy-ratelimited = %q, want true", got)
	}
	if got := r.Header.Get("Content-Type"); got != "application/problem+json" {
		t.Errorf("content-type = %q, want application/problem+json", got)
	}
	if got := firstLimit(r); got != strconv.Itoa(limit) {
		t.Errorf("x-ratelimit-limit %q: first value %s, want %d (%s)", r.Header.Get("X-Ratelimit-Limit"), got, limit, rule)
	}
	if got := headerInt(t, r, "X-Ratelimit-Remaining"); got != 0 {
		t.Errorf("x-ratelimit-remaining = %d on a 429, want 0", got)
	}
	retry := headerInt(t, r, "Retry-After")
	if retry < 1 {
		t.Errorf("Retry-After = %d, want ≥ 1", retry)
	}
	var p problem
	if err := json.Unmarshal([]byte(r.Body), &p); err != nil {
		t.Fatalf("429 body is not JSON: %v: %q", err, r.Body)
	}
	if p.Status != http.StatusTooManyRequests || p.Limit != rule || p.Requests != limit || p.RetryAfter != retry || p.Title == "" {
		t.Errorf("problem body %+v, want status 429, limit %s, requests %d, retry_after %d (the Retry-After header)", p, rule, limit, retry)
	}
	if m := rateLimitFieldRE.FindStringSubmatch(r.Header.Get("RateLimit")); m == nil || m[1] != rule || m[2] != "0" {
		t.Errorf("RateLimit = %q, want \"%s\";r=0;t=<seconds>", r.Header.Get("RateLimit"), rule)
	}
	return p
}

// TestBinaryHasVTProtobuf checks that the envoy-rls these tests run (built
// by envoyRLSBinary, or $ENVOY_RLS_BIN) encodes its responses with
// go-control-plane's vtprotobuf code, as it says at start.
func TestBinaryHasVTProtobuf(t *testing.T) {
	r := startRLS(t, rlsOptions{})
	if log := r.Log(); !strings.Contains(log, "msg=\"envoy-rls serving\"") || !strings.Contains(log, "vtprotobuf=true") {
		t.Errorf("envoy-rls did not start with vtprotobuf=true; build it with -tags vtprotobuf. Its log:\n%s", log)
	}
}

func TestPerIPLimitThroughEnvoy(t *testing.T) {
	s := startStack(t, rlsOptions{})
	for i := 1; i <= perIP; i++ {
		r := get(t, s.Envoy.URL, "/")
		checkOK(t, r, "per_ip", perIP, perIP-i)
		// Without tenant headers only the per-IP descriptor is sent.
		if got, want := r.Header.Get("X-Ratelimit-Limit"), fmt.Sprintf(`%d, %d;w=60;name="per_ip"`, perIP, perIP); got != want {
			t.Errorf("x-ratelimit-limit = %q, want %q", got, want)
		}
		if got, want := r.Header.Get("RateLimit-Policy"), fmt.Sprintf(`"per_ip";q=%d;w=60`, perIP); got != want {
			t.Errorf("RateLimit-Policy = %q, want %q", got, want)
		}
		reset := headerInt(t, r, "X-Ratelimit-Reset")
		if reset < 0 || reset > 60 {
			t.Errorf("x-ratelimit-reset = %d, want within the 60 s window", reset)
		}
	}
	for range 2 { // denied requests consume nothing: the next is denied the same way
		r := get(t, s.Envoy.URL, "/")
		p := checkLimited(t, r, "per_ip", perIP)
		// Sliding window: the full current bucket keeps denying until the
		// bucket has ended, so Retry-After is at least the reset time.
		if reset := headerInt(t, r, "X-Ratelimit-Reset"); p.RetryAfter < reset {
			t.Errorf("Retry-After %d is before x-ratelimit-reset %d", p.RetryAfter, reset)
		}
		t.Logf("429 through Envoy: %v", r)
	}
}

// TestThroughEnvoyOverUnixSockets: Envoy reaches envoy-rls through a pipe
// address (--grpc.addr unix:...), and envoy-rls reaches Redis through its
// Unix socket (--redis.url unix://...), as on one host: the per-IP limit
// holds exactly, counted in that Redis.
func TestThroughEnvoyOverUnixSockets(t *testing.T) {
	redis := testenv.RedisServer(t, testenv.WithUnixSocket())
	r := startRLS(t, rlsOptions{RedisURL: "unix://" + redis.Socket, GRPCAddr: "unix:" + testenv.SocketPath(t, "rls.sock")})
	e := startEnvoy(t, r.GRPCAddr)
	before := redis.CommandCalls(t)["fcall"]
	for i := 1; i <= perIP; i++ {
		checkOK(t, get(t, e.URL, "/"), "per_ip", perIP, perIP-i)
	}
	checkLimited(t, get(t, e.URL, "/"), "per_ip", perIP)
	if got := redis.CommandCalls(t)["fcall"] - before; got < perIP+1 {
		t.Errorf("Redis ran %d check calls for %d requests, want at least one each", got, perIP+1)
	}
}

func TestTenantsAndUsersAreIndependent(t *testing.T) {
	s := startStack(t, rlsOptions{})
	// Tenant A exhausts per_tenant.
	for i := 1; i <= perTenant; i++ {
		checkOK(t, get(t, s.Envoy.URL, "/", "x-tenant-id", "A"), "per_tenant", perTenant, perTenant-i)
	}
	checkLimited(t, get(t, s.Envoy.URL, "/", "x-tenant-id", "A"), "per_tenant", perTenant)
	// Tenant B is untouched by A.
	checkOK(t, get(t, s.Envoy.URL, "/", "x-tenant-id", "B"), "per_tenant", perTenant, perTenant-1)

	// Inside tenant C, user u1 exhausts per_user_burst; u2 is untouched.
	for i := 1; i <= perUser; i++ {
		checkOK(t, get(t, s.Envoy.URL, "/", "x-tenant-id", "C", "x-user-id", "u1"), "per_user_burst", perUser, perUser-i)
	}
	r := get(t, s.Envoy.URL, "/", "x-tenant-id", "C", "x-user-id", "u1")
	checkLimited(t, r, "per_user_burst", perUser)
	// Envoy lists every descriptor's policy: per_ip, per_tenant and the
	// user's token bucket (window 3600 s).
	for _, want := range []string{`name="per_ip"`, `name="per_tenant"`, `2;w=3600;name="per_user_burst"`} {
		if !strings.Contains(r.Header.Get("X-Ratelimit-Limit"), want) {
			t.Errorf("x-ratelimit-limit %q lacks %s", r.Header.Get("X-Ratelimit-Limit"), want)
		}
	}
	// u2 is admitted while u1 is denied. Tenant C has now used its 3 (u1 twice,
	// u2 once), so per_tenant is the status closest to its limit.
	checkOK(t, get(t, s.Envoy.URL, "/", "x-tenant-id", "C", "x-user-id", "u2"), "per_tenant", perTenant, perTenant-perUser-1)
}

func TestMissingTenantHeaderIsStillLimitedPerIP(t *testing.T) {
	s := startStack(t, rlsOptions{})
	// x-user-id without x-tenant-id: Envoy drops both tenant descriptors.
	for i := 1; i <= perIP; i++ {
		r := get(t, s.Envoy.URL, "/", "x-user-id", "u1")
		checkOK(t, r, "per_ip", perIP, perIP-i)
		if got, want := r.Header.Get("X-Ratelimit-Limit"), fmt.Sprintf(`%d, %d;w=60;name="per_ip"`, perIP, perIP); got != want {
			t.Errorf("x-ratelimit-limit = %q, want %q (per_ip only)", got, want)
		}
	}
	checkLimited(t, get(t, s.Envoy.URL, "/", "x-user-id", "u1"), "per_ip", perIP)
	// A client cannot pick another address with X-Forwarded-For at the edge.
	checkLimited(t, get(t, s.Envoy.URL, "/", "X-Forwarded-For", "203.0.113.7"), "per_ip", perIP)
}

func TestExpensiveRouteThroughEnvoy(t *testing.T) {
	s := startStack(t, rlsOptions{})
	for i := 1; i <= expensive; i++ {
		checkOK(t, get(t, s.Envoy.URL, "/expensive"), "expensive_per_ip", expensive, expensive-i)
	}
	checkLimited(t, get(t, s.Envoy.URL, "/expensive/report"), "expensive_per_ip", expensive)
	// The path is normalised before routing: no detour around the limit.
	checkLimited(t, get(t, s.Envoy.URL, "//expensive"), "expensive_per_ip", expensive)
	// Other routes only count per IP; /expensive-foo is not the expensive route.
	checkOK(t, get(t, s.Envoy.URL, "/expensive-foo"), "per_ip", perIP, perIP-expensive-1)
}

func TestTwoEnvoysShareOneLimit(t *testing.T) {
	redis := testenv.RedisServer(t)
	var edges []*envoy
	for range 2 {
		r := startRLS(t, rlsOptions{Redis: redis.Addr})
		edges = append(edges, startEnvoy(t, r.GRPCAddr))
	}
	// Alternating between two gateways (each with its own envoy-rls) still
	// admits the limit once: the counter lives in the shared Redis.
	for i := 1; i <= perIP; i++ {
		checkOK(t, get(t, edges[i%2].URL, "/"), "per_ip", perIP, perIP-i)
	}
	checkLimited(t, get(t, edges[0].URL, "/"), "per_ip", perIP)
	checkLimited(t, get(t, edges[1].URL, "/"), "per_ip", perIP)
}

func TestEnvoyFailsOpenWithoutEnvoyRLS(t *testing.T) {
	s := startStack(t, rlsOptions{})
	checkOK(t, get(t, s.Envoy.URL, "/"), "per_ip", perIP, perIP-1)
	before := envoyStat(t, s.Envoy, "cluster.backend.ratelimit.failure_mode_allowed")
	s.RLS.Stop()
	const n = perIP + 5
	for range n {
		r := get(t, s.Envoy.URL, "/")
		if r.Status != http.StatusOK || r.Body != "ok\n" || r.Header.Get("X-Ratelimit-Limit") != "" {
			t.Fatalf("without envoy-rls: want a plain 200 (fail open), got %v", r)
		}
	}
	if after := envoyStat(t, s.Envoy, "cluster.backend.ratelimit.failure_mode_allowed"); after-before != n {
		t.Errorf("ratelimit.failure_mode_allowed went from %d to %d, want +%d", before, after, n)
	}
}

func TestRedisDownFollowsEachRulesFailureMode(t *testing.T) {
	s := startStack(t, rlsOptions{Args: []string{"--fallback.instances", "1", "--log.format", "json"}})
	checkOK(t, get(t, s.Envoy.URL, "/"), "per_ip", perIP, perIP-1)
	s.Redis.Stop()

	// expensive_per_ip has failure_mode deny: denied at once, and again.
	for range 2 {
		checkLimited(t, get(t, s.Envoy.URL, "/expensive"), "expensive_per_ip", expensive)
	}

	// per_ip has failure_mode fallback: the in-process limiter, at this
	// instance's share (--fallback.instances 1: the whole limit), starting
	// from an empty count (the denied /expensive requests consumed nothing).
	for i := 1; i <= perIP; i++ {
		r := get(t, s.Envoy.URL, "/")
		if r.Status != http.StatusOK || r.Header.Get("X-Ratelimit-Limit") == "" {
			t.Fatalf("Redis down, request %d: want a 200 decided by the fallback, got %v", i, r)
		}
		if got := headerInt(t, r, "X-Ratelimit-Remaining"); got != perIP-i {
			t.Errorf("Redis down, request %d: x-ratelimit-remaining = %d, want %d", i, got, perIP-i)
		}
	}
	checkLimited(t, get(t, s.Envoy.URL, "/"), "per_ip", perIP)
	if got := rlsMetric(t, s.RLS, "envoy_rls_fallback_active"); got != "1" {
		t.Errorf("envoy_rls_fallback_active = %q, want 1", got)
	}

	// The log stays JSON: go-redis's complaint about the dials that
	// failed comes through envoy-rls's logger, with the outage's line.
	records := s.RLS.waitJSONRecord("go-redis's failed dial", func(r map[string]any) bool {
		msg, _ := r["msg"].(string)
		return r["component"] == "go-redis" && r["level"] == "WARN" && strings.HasPrefix(msg, "connection pool: failed to dial")
	})
	outage := false
	for _, r := range records {
		outage = outage || r["msg"] == "store unavailable: deciding by failure_mode"
	}
	if !outage {
		t.Errorf("no \"store unavailable\" record in the log:\n%s", s.RLS.Log())
	}
}

func TestShippedConfigThroughEnvoy(t *testing.T) {
	s := startStack(t, rlsOptions{ConfigDir: filepath.Join(repoRoot(t), "config")})
	r := get(t, s.Envoy.URL, "/")
	checkOK(t, r, "per_ip", 120, 119)
	if got, want := r.Header.Get("X-Ratelimit-Limit"), `120, 120;w=60;name="per_ip"`; got != want {
		t.Errorf("x-ratelimit-limit = %q, want %q", got, want)
	}
	// tenant + user: the token bucket (2/s, burst 10) is closest to its limit.
	r = get(t, s.Envoy.URL, "/", "x-tenant-id", "acme", "x-user-id", "alice")
	checkOK(t, r, "per_user_burst", 2, 9)
	for _, want := range []string{`120;w=60;name="per_ip"`, `60;w=60;name="per_tenant"`, `2;w=1;name="per_user_burst"`} {
		if !strings.Contains(r.Header.Get("X-Ratelimit-Limit"), want) {
			t.Errorf("x-ratelimit-limit %q lacks %s", r.Header.Get("X-Ratelimit-Limit"), want)
		}
	}
	r = get(t, s.Envoy.URL, "/expensive")
	checkOK(t, r, "expensive_per_ip", 5, 4)
	t.Logf("shipped config, /expensive: %v", r)
}

// envoyStat reads one counter from Envoy's admin /stats.
func envoyStat(t *testing.T, e *envoy, name string) int {
	t.Helper()
	r := get(t, e.Admin, "/stats?filter="+url.QueryEscape("^"+regexp.QuoteMeta(name)+"$"))
	sc := bufio.NewScanner(strings.NewReader(r.Body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+": "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("stat %s = %q", name, v)
			}
			return n
		}
	}
	return 0 // Envoy omits counters it has not created yet
}

// rlsMetric returns the value of an unlabelled metric from envoy-rls /metrics.
func rlsMetric(t *testing.T, r *rls, name string) string {
	t.Helper()
	resp := get(t, "http://"+r.HTTPAddr, "/metrics")
	sc := bufio.NewScanner(strings.NewReader(resp.Body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return v
		}
	}
	t.Fatalf("metric %s not found in /metrics", name)
	return ""
}
