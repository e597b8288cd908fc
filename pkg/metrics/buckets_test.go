package metrics_test

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoy-rls/envoy-rls/pkg/failsoft"
	"github.com/envoy-rls/envoy-rls/pkg/metrics"
)

// latencyHistograms are the histograms whose buckets TestLatencyBuckets
// checks.
var latencyHistograms = []string{"envoy_rls_request_duration_seconds", "envoy_rls_store_duration_seconds"}

// TestLatencyBuckets: both latency histograms share bounds that rise by at
// most 1.5 times from one to the next, from at most 25µs to at least 1s, so
// that a quantile estimated within a bucket (histogram_quantile, rls-bench
// --server-metrics) is off by at most a third; and the thresholds operators
// compare latency with are bounds, so that the share of requests under them
// is read exactly from one bucket (the alerts' thresholds:
// deploy.TestLatencyThresholdsAreBucketBounds, from the rules file).
func TestLatencyBuckets(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := metrics.New(reg); err != nil {
		t.Fatal(err)
	}
	bounds := latencyBounds(t, reg)
	var first []float64
	for _, name := range latencyHistograms {
		b, ok := bounds[name]
		if !ok {
			t.Fatalf("no histogram %s", name)
		}
		if first == nil {
			first = b
		} else if !slices.Equal(b, first) {
			t.Errorf("%s has bounds %v, want those of %s: %v", name, b, latencyHistograms[0], first)
		}
	}
	if len(first) == 0 || first[0] > 25e-6 || first[len(first)-1] < 1 {
		t.Fatalf("bounds %v do not span 25µs to 1s", first)
	}
	for i := 1; i < len(first); i++ {
		if first[i] <= first[i-1] || first[i] > 1.5*first[i-1]*(1+1e-12) {
			t.Errorf("bound %g follows %g: want larger by at most 1.5 times", first[i], first[i-1])
		}
	}
	for _, th := range []struct {
		what string
		d    time.Duration
	}{
		{"the README's p99 target", time.Millisecond},
		{"the fail-soft layer's default deadline margin", failsoft.DefaultDeadlineMargin},
		{"--redis.timeout's default", 25 * time.Millisecond},
	} {
		if !slices.Contains(first, th.d.Seconds()) {
			t.Errorf("%s (%v) is not a bucket bound", th.what, th.d)
		}
	}
}

// latencyBounds returns the upper bounds of every histogram gathered from
// reg, by name.
func latencyBounds(t *testing.T, reg *prometheus.Registry) map[string][]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			if h == nil {
				continue
			}
			var b []float64
			for _, bk := range h.GetBucket() {
				b = append(b, bk.GetUpperBound())
			}
			out[mf.GetName()] = b
		}
	}
	return out
}
