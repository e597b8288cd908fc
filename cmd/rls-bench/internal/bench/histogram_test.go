package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBucketLayout(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	check := func(v int64) {
		b := bucketOf(v)
		if hi := bucketHigh(b); hi < v {
			t.Fatalf("bucketHigh(bucketOf(%d)=%d) = %d < value", v, b, hi)
		}
		if b > 0 {
			if lo := bucketHigh(b-1) + 1; lo > v {
				t.Fatalf("bucket %d starts at %d > value %d", b, lo, v)
			} else if width := bucketHigh(b) - lo + 1; width*subCount > v && v >= subCount {
				t.Fatalf("bucket %d width %d is more than 1/%d of value %d", b, width, subCount, v)
			}
		}
	}
	for v := int64(0); v < 5000; v++ {
		check(v)
	}
	for range 100000 {
		check(r.Int64N(1 << (maxBits - 1)))
	}
	if b := bucketOf(math.MaxInt64); b != numBuckets-1 {
		t.Errorf("bucketOf(MaxInt64) = %d, want the last bucket %d", b, numBuckets-1)
	}
}

// nearestRank is the model: the value of rank ceil(q·n) in sorted samples.
func nearestRank(sorted []int64, q float64) int64 {
	rank := int(math.Ceil(q * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}

func TestQuantilesAgainstSortedSamples(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 2, 10, 999, 100000} {
		samples := make([]int64, n)
		// Log-normal around 300µs with a heavy tail, plus some tiny values.
		for i := range samples {
			samples[i] = int64(math.Exp(r.NormFloat64()*1.5 + math.Log(300e3)))
			if i%97 == 0 {
				samples[i] = r.Int64N(300)
			}
		}
		// Record into 8 per-caller histograms and merge, as Run does.
		parts := make([]Histogram, 8)
		for i, v := range samples {
			parts[i%len(parts)].Record(v)
		}
		var h Histogram
		for i := range parts {
			h.Merge(&parts[i])
		}
		sorted := slices.Clone(samples)
		slices.Sort(sorted)

		if h.Count() != uint64(n) {
			t.Fatalf("n=%d: Count() = %d", n, h.Count())
		}
		if h.Min() != time.Duration(sorted[0]) || h.Max() != time.Duration(sorted[n-1]) {
			t.Errorf("n=%d: Min/Max = %v/%v, want %v/%v", n, h.Min(), h.Max(), time.Duration(sorted[0]), time.Duration(sorted[n-1]))
		}
		var sum float64
		for _, v := range samples {
			sum += float64(v)
		}
		if want := sum / float64(n); math.Abs(float64(h.Mean())-want) > 1 {
			t.Errorf("n=%d: Mean() = %v, want %v", n, h.Mean(), want)
		}
		for _, q := range []float64{0.0001, 0.25, 0.5, 0.9, 0.99, 0.999, 0.9999, 1} {
			exact := nearestRank(sorted, q)
			got := int64(h.Quantile(q))
			// Never below the exact value, above it by less than one bucket
			// width (< exact/256, and exact below 256 ns).
			if got < exact || got > exact+exact/subCount {
				t.Errorf("n=%d: Quantile(%v) = %d, exact %d (allowed [%d, %d])", n, q, got, exact, exact, exact+exact/subCount)
			}
		}
	}
}

func TestHistogramEmptyAndNegative(t *testing.T) {
	var h Histogram
	if h.Quantile(0.5) != 0 || h.Max() != 0 || h.Mean() != 0 || h.Count() != 0 {
		t.Errorf("empty histogram: got non-zero summary")
	}
	var o Histogram
	h.Merge(&o) // merging empty into empty stays empty
	if h.Count() != 0 {
		t.Errorf("Count after merging empty = %d", h.Count())
	}
	h.Record(-5)
	if h.Count() != 1 || h.Max() != 0 || h.Quantile(1) != 0 {
		t.Errorf("negative value: Count=%d Max=%v p100=%v, want 1, 0, 0", h.Count(), h.Max(), h.Quantile(1))
	}
}
