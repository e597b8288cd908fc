package deploy

import (
	"os"
	"regexp"
	"strconv"
	"testing"
)

// histogramBounds returns the upper bounds of every histogram envoy-rls
// exports (exported), by the name of its _bucket series.
func histogramBounds(t *testing.T) map[string]map[float64]bool {
	t.Helper()
	_, _, fams := exported(t)
	out := map[string]map[float64]bool{}
	for _, mf := range fams {
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				bounds := map[float64]bool{}
				for _, b := range h.GetBucket() {
					bounds[b.GetUpperBound()] = true
				}
				out[mf.GetName()+"_bucket"] = bounds
			}
		}
	}
	return out
}

var (
	// bucketThreshold matches an alert on a quantile of a histogram:
	// the histogram's _bucket series, then a final "> threshold".
	bucketThreshold = regexp.MustCompile(`(?s)(envoy_rls_[a-z_]+_bucket).*>\s*([0-9.]+)\s*$`)
	// bucketSeries matches an input series of the rules' unit tests on a
	// histogram bucket, with its le.
	bucketSeries = regexp.MustCompile(`(envoy_rls_[a-z_]+_bucket)\{[^}]*le="([^"]+)"`)
)

// TestLatencyThresholdsAreBucketBounds: every alert on a latency quantile
// compares it with a bound of the histogram's buckets, where the quantile
// is exact rather than interpolated within a bucket, and the rules' unit
// tests feed only buckets envoy-rls exports, so that they describe what
// Prometheus will scrape.
func TestLatencyThresholdsAreBucketBounds(t *testing.T) {
	bounds := histogramBounds(t)
	alerts := 0
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			m := bucketThreshold.FindStringSubmatch(r.Expr)
			if m == nil {
				continue
			}
			alerts++
			v, err := strconv.ParseFloat(m[2], 64)
			if err != nil {
				t.Fatalf("%s %s: threshold %q: %v", rulesFile, r.Alert, m[2], err)
			}
			if b, ok := bounds[m[1]]; !ok {
				t.Errorf("%s %s: %s is not a histogram envoy-rls exports", rulesFile, r.Alert, m[1])
			} else if !b[v] {
				t.Errorf("%s %s: threshold %v is not a bound of %s", rulesFile, r.Alert, v, m[1])
			}
		}
	}
	if alerts < 2 {
		t.Errorf("%s: %d alerts on a latency histogram, want the store's and the requests'", rulesFile, alerts)
	}
	b, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	series := bucketSeries.FindAllStringSubmatch(string(b), -1)
	if len(series) == 0 {
		t.Fatalf("%s feeds no histogram bucket", rulesTestFile)
	}
	for _, m := range series {
		if m[2] == "+Inf" {
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatalf("%s: le %q: %v", rulesTestFile, m[2], err)
		}
		if !bounds[m[1]][v] {
			t.Errorf("%s feeds %s{le=%q}, which envoy-rls does not export", rulesTestFile, m[1], m[2])
		}
	}
}
