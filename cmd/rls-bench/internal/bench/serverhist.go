package bench

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ServerHistogram names a latency histogram that the target server exports
// in the Prometheus text format: the server's own account of the time it took
// to answer, scraped before and after the measured phase. The difference
// between it and the latency the generator measures is what the network, the
// kernel and the generator add, which on a small shared machine can be most
// of the tail.
type ServerHistogram struct {
	// URL of the metrics page, e.g. http://127.0.0.1:8080/metrics.
	URL string
	// Metric is the histogram's name (without _bucket), in seconds. All its
	// series (label sets) are added together.
	Metric string
}

// bucket is one cumulative bucket of a histogram: count observations at or
// below le seconds.
type bucket struct {
	le    float64
	count float64
}

// scrapeHistogram fetches h.URL and returns the cumulative buckets of
// h.Metric, summed over its series, in increasing le, ending with +Inf.
func scrapeHistogram(ctx context.Context, client *http.Client, h ServerHistogram) ([]bucket, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.URL, nil)
	if err != nil {
		return nil, fmt.Errorf("server histogram: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("server histogram: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("server histogram: GET %s: %s", h.URL, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("server histogram: parse %s: %w", h.URL, err)
	}
	mf, ok := families[h.Metric]
	if !ok {
		return nil, fmt.Errorf("server histogram: %s has no metric %q", h.URL, h.Metric)
	}
	if mf.GetType() != dto.MetricType_HISTOGRAM {
		return nil, fmt.Errorf("server histogram: %s: %q is a %s, not a histogram", h.URL, h.Metric, mf.GetType())
	}
	sum := map[float64]float64{}
	var bounds []float64 // of the first series; every series must have them
	for i, m := range mf.GetMetric() {
		hist := m.GetHistogram()
		var les []float64
		for _, b := range hist.GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) {
				les = append(les, b.GetUpperBound())
			}
		}
		if i == 0 {
			bounds = les
		} else if !slices.Equal(les, bounds) {
			// Added bound by bound, the sum would not be a histogram.
			return nil, fmt.Errorf("server histogram: %s: the series of %q have different buckets (%v and %v); cannot add them",
				h.URL, h.Metric, bounds, les)
		}
		for _, b := range hist.GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) { // +Inf is the sample count, added below
				sum[b.GetUpperBound()] += float64(b.GetCumulativeCount())
			}
		}
		sum[math.Inf(1)] += float64(hist.GetSampleCount())
	}
	out := make([]bucket, 0, len(sum))
	for le, c := range sum {
		out = append(out, bucket{le, c})
	}
	slices.SortFunc(out, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	for i := 1; i < len(out); i++ {
		if out[i].count < out[i-1].count {
			return nil, fmt.Errorf("server histogram: %s: %q is not cumulative (le=%g counts %g, le=%g counts %g)",
				h.URL, h.Metric, out[i-1].le, out[i-1].count, out[i].le, out[i].count)
		}
	}
	return out, nil
}

// subtractBuckets returns after − before, bucket by bucket (by le): the
// observations made between the two scrapes. A bucket before lacks counts
// as zero; a server that restarted in between (a count going down) is an
// error.
func subtractBuckets(before, after []bucket) ([]bucket, error) {
	was := make(map[float64]float64, len(before))
	for _, b := range before {
		was[b.le] = b.count
	}
	out := make([]bucket, len(after))
	for i, b := range after {
		d := b.count - was[b.le]
		if d < 0 {
			return nil, fmt.Errorf("server histogram: bucket le=%g went down from %g to %g (did the server restart?)", b.le, was[b.le], b.count)
		}
		out[i] = bucket{b.le, d}
	}
	return out, nil
}

// bucketQuantile estimates the q-quantile (0 < q < 1) of cumulative buckets
// as Prometheus's histogram_quantile does: it finds the bucket in which the
// rank q·total falls and interpolates linearly between its bounds (the
// lowest bucket starts at 0). A rank in the +Inf bucket returns the highest
// finite bound. It returns NaN when there are no observations.
func bucketQuantile(q float64, bs []bucket) float64 {
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return math.NaN()
	}
	rank := q * bs[len(bs)-1].count
	lower, below := 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return lower
			}
			return lower + (b.le-lower)*(rank-below)/(b.count-below)
		}
		lower, below = b.le, b.count
	}
	return lower
}

// ServerLatency is the server's own account of its latency over the
// measured phase (ServerHistogram), in milliseconds, estimated from its
// histogram's buckets: the figures are only as fine as the buckets.
type ServerLatency struct {
	Requests int64   `json:"requests"` // observations in the phase
	P50      float64 `json:"p50_ms"`
	P90      float64 `json:"p90_ms"`
	P99      float64 `json:"p99_ms"`
}

// serverLatency summarises the buckets observed between two scrapes.
func serverLatency(before, after []bucket) (*ServerLatency, error) {
	d, err := subtractBuckets(before, after)
	if err != nil {
		return nil, err
	}
	l := &ServerLatency{}
	if len(d) == 0 || d[len(d)-1].count == 0 {
		return l, nil
	}
	l.Requests = int64(d[len(d)-1].count)
	l.P50 = 1000 * bucketQuantile(0.50, d)
	l.P90 = 1000 * bucketQuantile(0.90, d)
	l.P99 = 1000 * bucketQuantile(0.99, d)
	return l, nil
}
