package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/envoy-rls/envoy-rls/pkg/descriptors"
	"github.com/envoy-rls/envoy-rls/pkg/memorybackend"
	"github.com/envoy-rls/envoy-rls/pkg/metrics"
	"github.com/envoy-rls/envoy-rls/pkg/rls"
	"github.com/envoy-rls/envoy-rls/pkg/topk"
)

// debugYAML is the configuration of the debug tools' tests.
const debugYAML = `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {name: per_ip, unit: minute, requests_per_unit: 3}
  - key: tenant
    descriptors:
      - key: user
        rate_limit: {name: per_user, unit: hour, requests_per_unit: 2, algorithm: token_bucket}
`

// writeDebugConfig writes debugYAML to a new folder and returns it.
func writeDebugConfig(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "edge.yaml"), debugYAML)
	return dir
}

// debugTarget is a running service: its gRPC client and debug address.
type debugTarget struct {
	client rlsv3.RateLimitServiceClient
	debug  string
}

type fixedConfig struct{ cfg *descriptors.Config }

func (f fixedConfig) Current() *descriptors.Config { return f.cfg }

// startDebugHarness runs, on loopback, what serve wires for the debug tools:
// an rls.Service on the memory backend whose Observer is
// debugTools.observer(rlsObserver{metrics}), served over gRPC, and a debug
// listener with debugTools.register.
func startDebugHarness(t *testing.T, dir string, o debugOptions) debugTarget {
	t.Helper()
	cfg, err := descriptors.Load(dir, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	mem := memorybackend.New(memorybackend.Options{})
	t.Cleanup(func() { mem.Close() })
	dbg := newDebugTools(o, nil)
	svc, err := rls.New(rls.Options{Config: fixedConfig{cfg}, Limiter: mem, Observer: dbg.observer(rlsObserver{m: m})})
	if err != nil {
		t.Fatal(err)
	}
	dbg.setService(svc)

	gs := grpc.NewServer()
	svc.Register(gs)
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	dbg.register(mux)
	hs := &http.Server{Handler: mux}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() { done <- gs.Serve(gl) }()
	go func() { done <- ignoreClosed(hs.Serve(hl)) }()
	conn, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
		hs.Close()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("server: %v", err)
			}
		}
	})
	return debugTarget{client: rlsv3.NewRateLimitServiceClient(conn), debug: hl.Addr().String()}
}

func httpGet(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func (tg debugTarget) explain(t *testing.T, query string) rls.Explanation {
	t.Helper()
	code, body := httpGet(t, "http://"+tg.debug+"/debug/explain?"+query)
	if code != http.StatusOK {
		t.Fatalf("explain?%s: %d %s", query, code, body)
	}
	var ex rls.Explanation
	if err := json.Unmarshal([]byte(body), &ex); err != nil {
		t.Fatalf("explain?%s: %v in %s", query, err, body)
	}
	return ex
}

func (tg debugTarget) call(t *testing.T, kv ...string) rlsv3.RateLimitResponse_Code {
	t.Helper()
	resp, err := tg.client.ShouldRateLimit(context.Background(),
		&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonrl.RateLimitDescriptor{desc(kv...)}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.OverallCode
}

// positionOf is file:line:col of the first occurrence of s in debugYAML
// (1-based, as the descriptors package reports positions).
func positionOf(t *testing.T, file, s string) string {
	t.Helper()
	for i, l := range strings.Split(debugYAML, "\n") {
		if c := strings.Index(l, s); c >= 0 {
			return fmt.Sprintf("%s:%d:%d", file, i+1, c+1)
		}
	}
	t.Fatalf("%q not in debugYAML", s)
	return ""
}

// testExplainEndToEnd: /debug/explain names the rule and its counter, sees
// what real requests counted, and counts nothing itself.
func testExplainEndToEnd(t *testing.T, tg debugTarget, configDir string) {
	file := filepath.Join(configDir, "edge.yaml")
	ex := tg.explain(t, "domain=edge&descriptor=remote_address=10.1.2.3")
	if ex.Rule == nil || ex.Rule.Name != "per_ip" || ex.Rule.ID != "remote_address" ||
		ex.Rule.Position != positionOf(t, file, "key: remote_address") || len(ex.Limits) != 1 {
		t.Fatalf("explain: %+v %+v", ex.Rule, ex.Limits)
	}
	l := ex.Limits[0]
	if l.Algorithm != "sliding_window" || l.Requests != 3 || l.Window != "1m0s" || l.FailureMode != "fallback" ||
		l.Shadow || !l.Allowed || l.Remaining != 3 || l.Source != "store" || ex.Code != "OK" ||
		l.Position != positionOf(t, file, "{name: per_ip") {
		t.Errorf("fresh counter: %+v (code %s)", l, ex.Code)
	}
	if got := tg.call(t, "remote_address", "10.1.2.3"); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first request: %v", got)
	}
	for i := range 5 {
		if ex := tg.explain(t, "domain=edge&descriptor=remote_address=10.1.2.3"); ex.Limits[0].Remaining != 2 {
			t.Fatalf("explain %d after one request: remaining %d, want 2", i, ex.Limits[0].Remaining)
		}
	}
	// Five explains consumed nothing: exactly two more requests pass.
	var codes []rlsv3.RateLimitResponse_Code
	for range 3 {
		codes = append(codes, tg.call(t, "remote_address", "10.1.2.3"))
	}
	if fmt.Sprint(codes) != "[OK OK OVER_LIMIT]" {
		t.Errorf("requests after the explains: %v, want [OK OK OVER_LIMIT]", codes)
	}
	ex = tg.explain(t, "domain=edge&descriptor=remote_address=10.1.2.3")
	if l := ex.Limits[0]; l.Allowed || l.Remaining != 0 || l.RetryAfterMS <= 0 || ex.Code != "OVER_LIMIT" {
		t.Errorf("exhausted counter: %+v (code %s)", l, ex.Code)
	}

	// Two entries, through repeated entry= parameters; text form.
	code, text := httpGet(t, "http://"+tg.debug+"/debug/explain?domain=edge&entry=tenant=acme&entry=user=a,b&format=text")
	for _, want := range []string{"domain edge, descriptor tenant=acme,user=a,b: OK", "rule per_user (id tenant.user) at " + positionOf(t, file, "key: user"),
		"token_bucket", "2/1h0m0s", "config "} {
		if code != http.StatusOK || !strings.Contains(text, want) {
			t.Errorf("text explain (%d) lacks %q:\n%s", code, want, text)
		}
	}
	if ex := tg.explain(t, "domain=edge&descriptor=nomatch=x"); ex.Rule != nil || !ex.KnownDomain || ex.Code != "OK" {
		t.Errorf("no rule: %+v", ex)
	}
	// An empty value (Envoy sends a present but empty header so) matches
	// the key-only rule, as a request with it is counted.
	if ex := tg.explain(t, "domain=edge&descriptor=remote_address="); ex.Rule == nil || ex.Rule.ID != "remote_address" {
		t.Errorf("empty value: %+v, want the key-only rule remote_address", ex)
	}
	if ex := tg.explain(t, "domain=nope&descriptor=remote_address=x"); ex.KnownDomain {
		t.Errorf("unknown domain: %+v", ex)
	}
	for q, want := range map[string]string{
		"domain=edge":                                        "no descriptor",
		"domain=edge&descriptor=novalue":                     "want key=value",
		"descriptor=remote_address=x":                        "domain: must not be empty",
		"domain=edge&descriptor=a=b&entry=c=d":               "not both",
		"domain=edge&descriptor==x":                          "want key=value",
		"domain=edge&descriptor=a=b&descriptor=remote_addr=": "one descriptor at a time",
		"domain=edge&descriptor=a=b&format=xml":              `format "xml": want text or json`,
		"domain=edge&descriptor=a=b&format=TEXT":             `format "TEXT": want text or json`,
	} {
		code, body := httpGet(t, "http://"+tg.debug+"/debug/explain?"+q)
		if code != http.StatusBadRequest || !strings.Contains(body, want) {
			t.Errorf("explain?%s = %d %q, want 400 containing %q", q, code, body, want)
		}
	}
}

// testTopEndToEnd sends a skewed stream of denials and checks /debug/top and
// `envoy-rls top` against the denials the responses reported.
func testTopEndToEnd(t *testing.T, tg debugTarget, capacity int, full bool) {
	// Start from zero whatever the target denied before.
	req, err := http.NewRequest(http.MethodDelete, "http://"+tg.debug+"/debug/top", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE /debug/top: %v %v", resp, err)
	}
	resp.Body.Close()
	denied := map[string]uint64{} // the model: OVER_LIMIT answers per value
	send := func(key, value string, n int) {
		for range n {
			if tg.call(t, key, value) == rlsv3.RateLimitResponse_OVER_LIMIT {
				denied[value]++
			}
		}
	}
	send("remote_address", "192.168.100.1", 3+40) // per_ip admits 3 a minute
	send("remote_address", "192.168.100.2", 3+20)
	send("remote_address", "203.0.113.77", 3+4)
	for i := range 3 * capacity { // a long tail of one denial each
		send("remote_address", fmt.Sprintf("198.51.100.%d", i), 3+1)
	}
	var n uint64
	for _, c := range denied {
		n += c
	}
	if denied["192.168.100.1"] != 40 || denied["192.168.100.2"] != 20 {
		t.Fatalf("denials %v: the limit is not 3 a minute", denied)
	}
	// stored is how /debug/top spells remote_address=v.
	stored := func(v string) string {
		d := newDebugTools(debugOptions{topFullValues: full}, nil)
		return "remote_address=" + string(d.appendValue(nil, v))
	}

	code, body := httpGet(t, "http://"+tg.debug+"/debug/top?n=5&rule=per_ip")
	if code != http.StatusOK {
		t.Fatalf("/debug/top: %d %s", code, body)
	}
	var rep topReport
	if err := json.Unmarshal([]byte(body), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Limits) != 1 || rep.FullValues != full || rep.Capacity != capacity {
		t.Fatalf("/debug/top: %s", body)
	}
	l := rep.Limits[0]
	if l.Domain != "edge" || l.Rule != "per_ip" || l.Limit != "per_ip" || l.Outcome != "over_limit" ||
		l.Denied != n || l.Monitored != capacity || l.ErrorBound != n/uint64(capacity) || len(l.Top) != 5 {
		t.Fatalf("per_ip: %+v, want %d denials", l, n)
	}
	// Space-Saving: the two heaviest are far above N/m, so they are found,
	// first, and each count bounds the truth.
	for i, v := range []string{"192.168.100.1", "192.168.100.2"} {
		it := l.Top[i]
		if it.Key != stored(v) || it.Count < denied[v] || it.Count-it.Error > denied[v] || it.Error > l.ErrorBound {
			t.Errorf("top[%d] = %+v, want %s with %d denials (bound %d)", i, it, stored(v), denied[v], l.ErrorBound)
		}
	}
	for _, it := range l.Top {
		if !full && strings.Contains(it.Key, "100.1") {
			t.Errorf("value stored whole without --debug.top-full-values: %q", it.Key)
		}
	}

	// A two-entry descriptor, and shadow-free tables only for denials.
	for range 5 {
		if tg.call(t, "tenant", "acme", "user", "bob") == rlsv3.RateLimitResponse_OVER_LIMIT {
			denied["acme/bob"]++
		}
	}
	_, body = httpGet(t, "http://"+tg.debug+"/debug/top?domain=edge&rule=per_user")
	rep = topReport{}
	if err := json.Unmarshal([]byte(body), &rep); err != nil {
		t.Fatal(err)
	}
	d := newDebugTools(debugOptions{topFullValues: full}, nil)
	wantKey := "tenant=" + string(d.appendValue(nil, "acme")) + ",user=" + string(d.appendValue(nil, "bob"))
	if len(rep.Limits) != 1 || len(rep.Limits[0].Top) != 1 || rep.Limits[0].Top[0] != (topk.Item{Key: wantKey, Count: denied["acme/bob"]}) {
		t.Errorf("per_user: %s, want %s × %d", body, wantKey, denied["acme/bob"])
	}

	// The subcommand prints the same as a table.
	var out, errOut bytes.Buffer
	if err := topMain([]string{"--addr", tg.debug, "--n", "3"}, &out, &errOut); err != nil {
		t.Fatalf("top: %v (%s)", err, errOut.String())
	}
	for _, want := range []string{
		fmt.Sprintf("edge / per_ip / per_ip (over_limit): %d denied, %d values monitored", n, capacity),
		"edge / per_user / per_user (over_limit)",
		"DENIED", stored("192.168.100.1"), stored("192.168.100.2"), wantKey,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("top output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Count(out.String(), "remote_address=") != 3 {
		t.Errorf("--n 3 printed %d per_ip rows:\n%s", strings.Count(out.String(), "remote_address="), out.String())
	}
	out.Reset()
	if err := topMain([]string{"--addr", tg.debug, "--json", "--reset", "--domain", "edge"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || len(rep.Limits) != 2 {
		t.Errorf("top --json: %v %s", err, out.String())
	}
	_, body = httpGet(t, "http://"+tg.debug+"/debug/top")
	if err := json.Unmarshal([]byte(body), &rep); err != nil || len(rep.Limits) != 0 {
		t.Errorf("after --reset: %v %s", err, body)
	}
}

func TestDebugExplainEndToEnd(t *testing.T) {
	dir := writeDebugConfig(t)
	testExplainEndToEnd(t, startDebugHarness(t, dir, debugOptions{}), dir)
}

func TestDebugTopEndToEnd(t *testing.T) {
	for _, full := range []bool{false, true} {
		t.Run(fmt.Sprint("full=", full), func(t *testing.T) {
			dir := writeDebugConfig(t)
			testTopEndToEnd(t, startDebugHarness(t, dir, debugOptions{topCapacity: 8, topFullValues: full}), 8, full)
		})
	}
}

func TestTopCommandErrors(t *testing.T) {
	var out, errOut bytes.Buffer
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	if err := topMain([]string{"--addr", addr}, &out, &errOut); err == nil || !strings.Contains(err.Error(), "--debug.addr") {
		t.Errorf("unreachable server: %v", err)
	}
	if err := topMain([]string{"--n", "0"}, &out, &errOut); err == nil {
		t.Error("--n 0 accepted")
	}
	if err := topMain([]string{"extra"}, &out, &errOut); err == nil {
		t.Error("an argument accepted")
	}
	// http.Client takes a timeout of 0 or less for none: top would wait
	// for ever on a server that never answers.
	for _, d := range []string{"0s", "-1s"} {
		if err := topMain([]string{"--addr", addr, "--timeout", d}, &out, &errOut); err == nil || !strings.Contains(err.Error(), "--timeout") {
			t.Errorf("--timeout %s: %v, want a usage error naming it", d, err)
		}
	}
}

// TestHTTPServersCloseIdleConnections: the metrics and debug listeners close
// a keep-alive connection left idle (net/http waits for the next request
// without a deadline otherwise: any client could hold connections, each
// with a goroutine and a file, for ever; a review's finding), bound the
// headers' arrival, and set no write timeout, which would cut
// /debug/pprof/profile short.
func TestHTTPServersCloseIdleConnections(t *testing.T) {
	s := newHTTPServer(http.NotFoundHandler(), nil)
	if s.IdleTimeout <= 0 || s.IdleTimeout > httpIdleTimeout || s.ReadHeaderTimeout <= 0 || s.WriteTimeout != 0 {
		t.Errorf("IdleTimeout %v, ReadHeaderTimeout %v, WriteTimeout %v", s.IdleTimeout, s.ReadHeaderTimeout, s.WriteTimeout)
	}
}

func TestAppendValue(t *testing.T) {
	cut := newDebugTools(debugOptions{}, nil)
	full := newDebugTools(debugOptions{topFullValues: true}, nil)
	for _, v := range []string{"", "10.0.0.1", "192.168.100.1", "Bearer eyJhbGciOiJIUzI1NiJ9.secret", "ééééé"} {
		got := string(cut.appendValue(nil, v))
		prefix, hash, ok := strings.Cut(got, "~")
		if !ok || len(hash) != 8 || len(prefix) > redactPrefix || !strings.HasPrefix(v, prefix) ||
			(len(v) <= redactPrefix && prefix != v) {
			t.Errorf("cut %q = %q", v, got)
		}
		if f := string(full.appendValue(nil, v)); f != v {
			t.Errorf("full %q = %q", v, f)
		}
	}
	// A value beyond what the service counts by name is cut even when
	// values are kept whole.
	long := strings.Repeat("v", rls.DefaultMaxValueBytes+1)
	if f := string(full.appendValue(nil, long)); f != string(cut.appendValue(nil, long)) {
		t.Errorf("full %d-byte value kept as %d bytes, want it cut", len(long), len(f))
	}
	a, b := cut.appendValue(nil, "192.168.100.1"), cut.appendValue(nil, "192.168.100.2")
	if string(a) == string(b) {
		t.Errorf("values with a common prefix collide: %s", a)
	}
}

// TestObserveDenyAllocations: a denial of an already monitored value costs
// no allocation.
func TestObserveDenyAllocations(t *testing.T) {
	d := newDebugTools(debugOptions{}, nil)
	obs := d.observer(nil).(rls.DenyObserver)
	dec := rls.Decision{Domain: "edge", Rule: "per_ip", Limit: "per_ip", Outcome: rls.OutcomeOverLimit}
	es := []descriptors.Entry{{Key: "remote_address", Value: "192.168.100.1"}}
	obs.ObserveDeny(dec, es)
	if a := testing.AllocsPerRun(1000, func() { obs.ObserveDeny(dec, es) }); a != 0 {
		t.Errorf("ObserveDeny: %v allocations per monitored denial, want 0", a)
	}
}
