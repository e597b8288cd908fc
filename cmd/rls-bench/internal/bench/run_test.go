package bench

import (
	"context"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

func mustTemplates(t *testing.T, srcs ...string) []Template {
	t.Helper()
	var out []Template
	for _, s := range srcs {
		tmpl, err := ParseTemplate(s)
		if err != nil {
			t.Fatalf("ParseTemplate(%q): %v", s, err)
		}
		out = append(out, tmpl)
	}
	return out
}

func startNoop(t *testing.T) *NoopServer {
	t.Helper()
	s, err := StartNoop("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("noop server: %v", err)
		}
	})
	return s
}

func TestRunClosedLoopRequestsAgainstNoop(t *testing.T) {
	s := startNoop(t)
	res, err := Run(context.Background(), Options{
		Addr:        s.Addr(),
		Label:       "noop",
		Connections: 3,
		Concurrency: 7,
		Requests:    300,
		Descriptors: mustTemplates(t, "remote_address=10.0.{i}", "tenant=t{i%10},user=u{i}"),
		Cardinality: 1000,
		CPU:         []CPUProbe{{Name: "self"}},
		Timeout:     time.Minute, // a slow test machine must not turn into errors
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Requests != 300 || res.OK != 300 || res.OverLimit != 0 || res.Errors != 0 {
		t.Errorf("requests=%d ok=%d over=%d errors=%d (%v), want 300/300/0/0",
			res.Requests, res.OK, res.OverLimit, res.Errors, res.ErrorKinds)
	}
	if res.Mode != "closed" || res.Callers != 7 || res.Connections != 3 || res.Descriptors != 2 || res.Label != "noop" {
		t.Errorf("result describes the wrong run: %+v", res)
	}
	if !(res.P50 <= res.P90 && res.P90 <= res.P99 && res.P99 <= res.P999 && res.P999 <= res.Max) || res.Max <= 0 {
		t.Errorf("percentiles not ordered or empty: p50=%v p90=%v p99=%v p99.9=%v max=%v", res.P50, res.P90, res.P99, res.P999, res.Max)
	}
	if len(res.CPU) != 1 || res.CPU[0].Name != "self" || res.CPU[0].Seconds < 0 {
		t.Errorf("CPU = %+v, want one non-negative probe named self", res.CPU)
	}
}

// judgeServer answers OVER_LIMIT when the user entry's number is odd and OK
// otherwise, and remembers what it saw, so the test can check that the load
// generator sent what the templates say and classified the answers.
type judgeServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	mu      sync.Mutex
	calls   int
	odd     int
	domains map[string]int
	hits    map[uint32]int
	users   map[int64]bool
	bad     []string // malformed requests
}

func (j *judgeServer) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.calls++
	j.domains[req.GetDomain()]++
	j.hits[req.GetHitsAddend()]++
	ds := req.GetDescriptors()
	if len(ds) != 2 || len(ds[0].GetEntries()) != 1 || len(ds[1].GetEntries()) != 2 {
		j.bad = append(j.bad, req.String())
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	}
	// Every descriptor of one request is expanded with the same index.
	ip := strings.TrimPrefix(ds[0].GetEntries()[0].GetValue(), "10.0.")
	tenant := ds[1].GetEntries()[0]
	user := ds[1].GetEntries()[1]
	i, err := strconv.ParseInt(strings.TrimPrefix(user.GetValue(), "u"), 10, 64)
	if err != nil || ip != strconv.FormatInt(i, 10) || tenant.GetKey() != "tenant" ||
		tenant.GetValue() != "t"+strconv.FormatInt(i%10, 10) || i < 0 || i >= 50 {
		j.bad = append(j.bad, req.String())
	}
	j.users[i] = true
	code := rlsv3.RateLimitResponse_OK
	if i%2 == 1 {
		j.odd++
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return richResponse(code), nil
}

func startJudge(t *testing.T) (*judgeServer, string) {
	t.Helper()
	j := &judgeServer{domains: map[string]int{}, hits: map[uint32]int{}, users: map[int64]bool{}}
	return j, serveRLS(t, j)
}

// serveRLS serves s on a free loopback port until the test ends, and
// returns its address.
func serveRLS(t *testing.T, s rlsv3.RateLimitServiceServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, s)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("test server: %v", err)
		}
	})
	return lis.Addr().String()
}

// TestRunSendsTemplatesAndClassifies checks the requests and the counts,
// with responses read for their overall_code alone (the default) and
// decoded whole (FullDecode). The judge's responses carry every kind of
// field, so the code-only reader has to skip them all.
func TestRunSendsTemplatesAndClassifies(t *testing.T) {
	for _, full := range []bool{false, true} {
		t.Run(fmt.Sprintf("full-decode=%v", full), func(t *testing.T) { testRunSendsTemplatesAndClassifies(t, full) })
	}
}

func testRunSendsTemplatesAndClassifies(t *testing.T, full bool) {
	j, addr := startJudge(t)
	res, err := Run(context.Background(), Options{
		FullDecode:  full,
		Addr:        addr,
		Concurrency: 5,
		Requests:    400,
		Domain:      "bench",
		Hits:        3,
		Descriptors: mustTemplates(t, "remote_address=10.0.{i}", "tenant=t{i%10},user=u{i}"),
		Cardinality: 50,
		Seed:        42,
		Timeout:     time.Minute, // a slow test machine must not turn into errors
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.bad) > 0 {
		t.Fatalf("%d malformed requests, first: %s", len(j.bad), j.bad[0])
	}
	if res.FullDecode != full {
		t.Errorf("result says full_decode=%v, the run had %v", res.FullDecode, full)
	}
	if j.calls != 400 || j.domains["bench"] != 400 || j.hits[3] != 400 {
		t.Errorf("server saw calls=%d domains=%v hits=%v, want 400 calls in domain bench with hits_addend 3", j.calls, j.domains, j.hits)
	}
	if res.Requests != 400 || res.OverLimit != int64(j.odd) || res.OK != int64(400-j.odd) || res.Errors != 0 {
		t.Errorf("result ok=%d over=%d errors=%d; server answered %d OK and %d OVER_LIMIT",
			res.OK, res.OverLimit, res.Errors, 400-j.odd, j.odd)
	}
	// 400 uniform draws from 50 indexes: missing one has probability < 1e-5
	// (and the seed is fixed).
	if len(j.users) != 50 {
		t.Errorf("server saw %d distinct indexes, want all 50", len(j.users))
	}
}

func TestRunOpenLoopSendsEveryScheduledRequest(t *testing.T) {
	j, addr := startJudge(t)
	res, err := Run(context.Background(), Options{
		Addr:        addr,
		Concurrency: 4,
		Requests:    250,
		Rate:        5000,
		Descriptors: mustTemplates(t, "remote_address=10.0.{i}", "tenant=t{i%10},user=u{i}"),
		Cardinality: 50,
		// A loaded test machine (-race, other packages' tests) can be slow
		// to answer: give every request all the time it needs, since this
		// test checks accounting, not speed.
		Timeout: time.Hour,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Mode != "open" || res.Rate != 5000 {
		t.Errorf("mode=%s rate=%v, want open at 5000", res.Mode, res.Rate)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.bad) > 0 {
		t.Fatalf("%d malformed requests, first: %s", len(j.bad), j.bad[0])
	}
	if res.Scheduled != 250 || res.Requests != 250 || j.calls != 250 || res.Errors != 0 {
		t.Errorf("scheduled=%d recorded=%d server-received=%d errors=%d (%v), want 250/250/250/0",
			res.Scheduled, res.Requests, j.calls, res.Errors, res.ErrorKinds)
	}
	if res.OK+res.OverLimit != 250 || res.OverLimit != int64(j.odd) {
		t.Errorf("ok=%d over=%d, server answered %d OVER_LIMIT of 250", res.OK, res.OverLimit, j.odd)
	}
}

func TestRunUnreachableTarget(t *testing.T) {
	s := startNoop(t)
	addr := s.Addr()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := Run(context.Background(), Options{
		Addr:        addr,
		Requests:    1,
		Descriptors: mustTemplates(t, "k=v"),
		// Keep the test quick; the address is closed so it cannot connect.
		ConnectTimeout: 300 * time.Millisecond,
	})
	if err == nil || !strings.Contains(err.Error(), "connect to "+addr) {
		t.Errorf("Run against a closed port: err = %v, want a connect error naming %s", err, addr)
	}
}

// TestLateSendGetsWholeTimeout: a request sent long after its intended time
// (an open loop fallen behind its schedule) still gets the whole Timeout
// from its actual send, and is charged its lateness: answered OK, with a
// latency of at least the lateness. With the deadline at intended + Timeout
// it expired before it was sent, and the run counted the server's answers
// as DeadlineExceeded.
func TestLateSendGetsWholeTimeout(t *testing.T) {
	s := startNoop(t)
	o, err := Options{Addr: s.Addr(), Descriptors: mustTemplates(t, "k=v"), Timeout: time.Minute}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	cs, closeAll, err := dial(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	c := newCaller(&o, cs, 0, 0)
	late := 2 * o.Timeout
	c.call(context.Background(), o.Now().Add(-late))
	if c.ok != 1 || len(c.errs) != 0 {
		t.Fatalf("a late send: ok %d, errors %v; want it answered", c.ok, c.errs)
	}
	if q := c.hist.Max(); q < late {
		t.Errorf("latency recorded %v, want at least the lateness %v", q, late)
	}
}

// TestRunOpenLoopRate: an open-loop run of k requests reports at most its
// rate: they take k intervals, not k-1 (4 requests at 20/s: 20/s, not
// 26.7/s). Rates a schedule cannot keep, or that are not numbers, are
// refused.
func TestRunOpenLoopRate(t *testing.T) {
	s := startNoop(t)
	o := Options{Addr: s.Addr(), Descriptors: mustTemplates(t, "k=v"), Timeout: time.Minute, Requests: 4, Rate: 20}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.OK != 4 || res.RPS > 20 || res.RPS <= 0 {
		t.Errorf("4 requests at 20/s: ok %d, rps %v; want 4 at no more than 20/s", res.OK, res.RPS)
	}
	for _, rate := range []float64{math.NaN(), math.Inf(1), 2 * MaxRate} {
		o.Rate = rate
		if _, err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), "--rate") {
			t.Errorf("rate %v: %v, want an error naming --rate", rate, err)
		}
	}
}
