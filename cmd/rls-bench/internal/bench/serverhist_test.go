package bench

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// exposition renders a histogram named name, in seconds, in the Prometheus
// text format: one series per label value, each with cumulative counts per
// bound (le in seconds) and its total, plus a counter that is not a
// histogram.
func exposition(name string, series map[string][]bucket) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# HELP %s time to answer\n# TYPE %s histogram\n", name, name)
	for route, bs := range series {
		for _, x := range bs {
			le := fmt.Sprint(x.le)
			if math.IsInf(x.le, 1) {
				le = "+Inf"
			}
			fmt.Fprintf(&b, "%s_bucket{route=%q,le=%q} %g\n", name, route, le, x.count)
		}
		total := bs[len(bs)-1].count
		fmt.Fprintf(&b, "%s_sum{route=%q} %g\n%s_count{route=%q} %g\n", name, route, total/100, name, route, total)
	}
	b.WriteString("# TYPE other_total counter\nother_total 3\n")
	return b.String()
}

var inf = math.Inf(1)

func TestBucketQuantile(t *testing.T) {
	bs := []bucket{{0.001, 50}, {0.002, 90}, {0.004, 99}, {inf, 100}}
	for _, c := range []struct{ q, want float64 }{
		{0.25, 0.0005}, // rank 25 in the first bucket, from 0
		{0.5, 0.001},
		{0.7, 0.0015}, // rank 70: 20 of the second bucket's 40
		{0.99, 0.004},
		{0.995, 0.004}, // in +Inf: the highest finite bound
	} {
		if got := bucketQuantile(c.q, bs); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("quantile %v = %v, want %v", c.q, got, c.want)
		}
	}
	if got := bucketQuantile(0.5, []bucket{{0.001, 0}, {inf, 0}}); !math.IsNaN(got) {
		t.Errorf("quantile of no observations = %v, want NaN", got)
	}
}

func TestScrapeHistogram(t *testing.T) {
	const name = "rls_request_duration_seconds"
	body := exposition(name, map[string][]bucket{
		"a": {{0.001, 3}, {0.01, 5}, {inf, 6}},
		"b": {{0.001, 1}, {0.01, 1}, {inf, 4}},
	})
	// Two series whose buckets differ: added bound by bound, 0.005 would
	// count fewer observations than 0.001.
	mixed := exposition(name, map[string][]bucket{
		"a": {{0.001, 3}, {inf, 3}},
		"b": {{0.005, 1}, {inf, 1}},
	})
	// Different buckets whose sum happens to be cumulative: 0.5 would count
	// 5 of the 6 observations at or below it, not all 6.
	mixedCumulative := exposition(name, map[string][]bucket{
		"a": {{0.1, 1}, {inf, 1}},
		"b": {{0.5, 5}, {inf, 5}},
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			fmt.Fprint(w, body)
		case "/mixed":
			fmt.Fprint(w, mixed)
		case "/mixed-cumulative":
			fmt.Fprint(w, mixedCumulative)
		case "/garbage":
			fmt.Fprint(w, "not { prometheus\n")
		default:
			http.Error(w, "no", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	got, err := scrapeHistogram(ctx, srv.Client(), ServerHistogram{URL: srv.URL + "/metrics", Metric: name})
	if err != nil {
		t.Fatal(err)
	}
	want := []bucket{{0.001, 4}, {0.01, 6}, {inf, 10}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("buckets = %v, want the two series added: %v", got, want)
	}
	for _, c := range []struct {
		h    ServerHistogram
		want string
	}{
		{ServerHistogram{URL: srv.URL + "/metrics", Metric: "absent_seconds"}, `no metric "absent_seconds"`},
		{ServerHistogram{URL: srv.URL + "/metrics", Metric: "other_total"}, "not a histogram"},
		{ServerHistogram{URL: srv.URL + "/fail", Metric: name}, "500"},
		{ServerHistogram{URL: srv.URL + "/garbage", Metric: name}, "parse"},
		{ServerHistogram{URL: srv.URL + "/mixed", Metric: name}, "different buckets"},
		{ServerHistogram{URL: srv.URL + "/mixed-cumulative", Metric: name}, "different buckets"},
	} {
		if _, err := scrapeHistogram(ctx, srv.Client(), c.h); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("scrape %s %s: %v, want an error with %q", c.h.URL, c.h.Metric, err, c.want)
		}
	}
}

func TestServerLatency(t *testing.T) {
	before := []bucket{{0.001, 10}, {0.002, 10}, {inf, 10}}
	after := []bucket{{0.001, 60}, {0.002, 109}, {inf, 110}}
	l, err := serverLatency(before, after)
	if err != nil {
		t.Fatal(err)
	}
	// 100 new observations: 50 up to 1 ms, 49 up to 2 ms, 1 beyond.
	if l.Requests != 100 || math.Abs(l.P50-1) > 1e-9 || math.Abs(l.P99-2) > 1e-9 || l.P90 <= 1 || l.P90 >= 2 {
		t.Errorf("latency = %+v, want 100 requests, p50 1 ms, p90 in (1, 2), p99 2 ms", l)
	}
	if _, err := serverLatency(after, before); err == nil || !strings.Contains(err.Error(), "restart") {
		t.Errorf("counts going down: %v, want an error", err)
	}
	if l, err := serverLatency(before, before); err != nil || l.Requests != 0 {
		t.Errorf("no new observations: %+v, %v", l, err)
	}
}

// TestRunReportsServerLatency: Run scrapes the target's histogram just
// before and just after the measured phase and reports what the server
// observed in between.
func TestRunReportsServerLatency(t *testing.T) {
	const name = "envoy_rls_request_duration_seconds"
	var scrapes atomic.Int32
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		// 1000 observations before the phase (the warm-up's), 200 more by
		// its end: 100 up to 0.1 ms, 100 up to 0.2 ms.
		bs := []bucket{{0.0001, 1000}, {0.0002, 1000}, {inf, 1000}}
		if scrapes.Add(1) > 1 {
			bs = []bucket{{0.0001, 1100}, {0.0002, 1200}, {inf, 1200}}
		}
		fmt.Fprint(w, exposition(name, map[string][]bucket{"": bs}))
	}))
	defer metrics.Close()
	s := startNoop(t)
	res, err := Run(context.Background(), Options{
		Addr:        s.Addr(),
		Requests:    50,
		Warmup:      time.Millisecond,
		Descriptors: mustTemplates(t, "remote_address=10.0.{i}"),
		Timeout:     time.Minute,
		Server:      &ServerHistogram{URL: metrics.URL, Metric: name},
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := scrapes.Load(); n != 2 {
		t.Errorf("%d scrapes, want 2 (before and after the measured phase)", n)
	}
	if l := res.Server; l == nil || l.Requests != 200 || math.Abs(l.P50-0.1) > 1e-9 || math.Abs(l.P99-0.198) > 1e-9 {
		t.Errorf("server latency = %+v, want 200 requests, p50 0.1 ms, p99 0.198 ms", l)
	}
	var tbl strings.Builder
	if err := WriteTable(&tbl, []*Result{res}, Aligned); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tbl.String(), "server p99 ms") || !strings.Contains(tbl.String(), "0.198") {
		t.Errorf("table lacks the server's p99:\n%s", tbl.String())
	}

	metrics.Close()
	if _, err := Run(context.Background(), Options{
		Addr:        s.Addr(),
		Requests:    1,
		Descriptors: mustTemplates(t, "remote_address=10.0.{i}"),
		Server:      &ServerHistogram{URL: metrics.URL, Metric: name},
	}); err == nil {
		t.Errorf("Run with an unreachable metrics URL: no error")
	}
}
